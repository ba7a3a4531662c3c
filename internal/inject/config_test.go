package inject

import (
	"strings"
	"testing"
)

func TestConfigValidate(t *testing.T) {
	tests := map[string]struct {
		change  func(*Config)
		wantErr string // a substring; "" for a valid Config
	}{
		"the test Config":                 {change: func(*Config) {}},
		"no image":                        {change: func(c *Config) { c.SidecarImage = "" }, wantErr: "sidecarImage is empty"},
		"bad pull policy":                 {change: func(c *Config) { c.ImagePullPolicy = "Sometimes" }, wantErr: "imagePullPolicy"},
		"no stream URI secret":            {change: func(c *Config) { c.StreamURI.Key = "" }, wantErr: "streamURI"},
		"no control token secret":         {change: func(c *Config) { c.ControlToken.Name = "" }, wantErr: "controlToken"},
		"port out of range":               {change: func(c *Config) { c.ListenPort = 70000 }, wantErr: "listenPort 70000"},
		"one port for both":               {change: func(c *Config) { c.ControlPort = 5672 }, wantErr: "both 5672"},
		"bad log max age":                 {change: func(c *Config) { c.LogMaxAge = "1w" }, wantErr: "logMaxAge"},
		"log max age 0 is forever":        {change: func(c *Config) { c.LogMaxAge = "0" }},
		"negative log max bytes":          {change: func(c *Config) { c.LogMaxBytes = -1 }, wantErr: "logMaxBytes"},
		"root":                            {change: func(c *Config) { c.RunAsUser = -1 }, wantErr: "runAsUser"},
		"broker users":                    {change: func(c *Config) { c.BrokerUsers, c.StreamURI = true, SecretKey{} }},
		"broker users, own Secret named":  {change: func(c *Config) { c.BrokerUsers, c.StreamURI = true, BrokerUserStreamURI }},
		"broker users and the shared URI": {change: func(c *Config) { c.BrokerUsers = true }, wantErr: "leave streamURI unset"},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			c := testConfig
			tt.change(&c)
			err := c.Validate()
			switch {
			case tt.wantErr == "" && err != nil:
				t.Errorf("Validate() = %v, want nil", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Errorf("Validate() = %v, want an error containing %q", err, tt.wantErr)
			}
		})
	}
}
