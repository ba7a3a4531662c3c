package selfsigned

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"time"
)

// Pair is a CA and a serving certificate signed by it with the
// certificate's key, each PEM encoded: CA and Cert as CERTIFICATE blocks,
// Key as a PKCS #8 PRIVATE KEY block.
type Pair struct {
	CA, Cert, Key []byte
}

// New makes a new CA, named name, and a serving certificate for hosts
// (DNS names or IP addresses; the first is its common name), both valid
// from an hour before now (for clock skew) until now+validity.
func New(name string, hosts []string, now time.Time, validity time.Duration) (Pair, error) {
	if len(hosts) == 0 {
		return Pair{}, errors.New("self-signed certificate: no host names")
	}
	if validity <= 0 {
		return Pair{}, fmt.Errorf("self-signed certificate: validity %s: want above 0", validity)
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Pair{}, fmt.Errorf("self-signed certificate: CA key: %w", err)
	}
	notBefore, notAfter := now.Add(-time.Hour), now.Add(validity)
	caTmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             notBefore,
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return Pair{}, fmt.Errorf("self-signed certificate: CA: %w", err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return Pair{}, fmt.Errorf("self-signed certificate: CA: %w", err)
	}

	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Pair{}, fmt.Errorf("self-signed certificate: serving key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: hosts[0]},
		NotBefore:    notBefore,
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		return Pair{}, fmt.Errorf("self-signed certificate: serving certificate: %w", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return Pair{}, fmt.Errorf("self-signed certificate: serving key: %w", err)
	}
	return Pair{
		CA:   pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		Cert: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		Key:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
	}, nil
}

// TLS is the serving certificate and its key, for a tls.Config.
func (p Pair) TLS() (tls.Certificate, error) { return tls.X509KeyPair(p.Cert, p.Key) }

// serial is a random 127-bit serial number, as RFC 5280 asks of a CA
// (unique per issuer; a CA here issues one certificate, but renewals make
// new CAs of the same name).
func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return n
}
