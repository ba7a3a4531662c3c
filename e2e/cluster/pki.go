package cluster

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// identity is a client certificate the cluster hands out. Kubernetes reads
// the user from the CN and the groups from O.
type identity struct {
	file   string // base name under pki/
	cn     string
	groups []string
}

var (
	idAdmin         = identity{"admin", "ms2m-admin", []string{"system:masters"}}
	idKubeletClient = identity{"apiserver-kubelet-client", "kube-apiserver-kubelet-client", []string{"system:masters"}}
	idKCM           = identity{"kube-controller-manager", "system:kube-controller-manager", nil}
	idScheduler     = identity{"kube-scheduler", "system:kube-scheduler", nil}
	// The bootstrap ClusterRoleBinding system:node-proxier grants this user
	// what kube-proxy needs.
	idKubeProxy = identity{"kube-proxy", "system:kube-proxy", nil}
)

func idNode(i int) identity {
	return identity{NodeName(i), "system:node:" + NodeName(i), []string{"system:nodes"}}
}

// ca is the cluster's certificate authority.
type ca struct {
	cert *x509.Certificate
	key  crypto.Signer
	pem  []byte
}

// ensurePKI writes whatever of the cluster's keys and certificates is not
// there yet: a CA, the apiserver's serving certificate, client certificates
// for the admin, the apiserver's kubelet client, the controller manager, the
// scheduler and each node's kubelet, and the service-account key pair. It
// also writes the kubeconfigs that use them.
func ensurePKI(l layout, nodes int) error {
	if err := os.MkdirAll(l.path("pki"), 0o700); err != nil {
		return err
	}
	c, err := loadOrCreateCA(l.pki("ca"), "ms2m-cluster-ca")
	if err != nil {
		return fmt.Errorf("cluster CA: %w", err)
	}
	// The front-proxy CA only exists so that the apiserver publishes a
	// request-header CA: without one, the controller manager and the
	// scheduler log an error about it every few seconds. Nothing is signed
	// with it.
	if _, err := loadOrCreateCA(l.pki("front-proxy-ca"), "ms2m-front-proxy-ca"); err != nil {
		return fmt.Errorf("front-proxy CA: %w", err)
	}
	if err := c.ensureServing(l.pki("apiserver"), "kube-apiserver",
		[]net.IP{net.ParseIP(HostIP), net.ParseIP("127.0.0.1"), net.ParseIP("10.96.0.1")},
		[]string{"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local", "localhost"}); err != nil {
		return fmt.Errorf("apiserver serving certificate: %w", err)
	}
	ids := []identity{idAdmin, idKubeletClient, idKCM, idScheduler, idKubeProxy}
	for i := 1; i <= nodes; i++ {
		ids = append(ids, idNode(i))
	}
	for _, id := range ids {
		if err := c.ensureClient(l.pki(id.file), id); err != nil {
			return fmt.Errorf("client certificate for %s: %w", id.cn, err)
		}
	}
	if err := ensureSAKey(l.pki("sa.key"), l.pki("sa.pub")); err != nil {
		return fmt.Errorf("service-account keys: %w", err)
	}

	server := fmt.Sprintf("https://%s:%d", HostIP, APIServerPort)
	kcs := map[string]identity{
		l.kubeconfig():                     idAdmin,
		l.compKubeconfig(compKCM):          idKCM,
		l.compKubeconfig(compScheduler):    idScheduler,
		l.compKubeconfig(idKubeProxy.file): idKubeProxy,
	}
	for i := 1; i <= nodes; i++ {
		kcs[l.node(i).kubeletKubeconfig()] = idNode(i)
	}
	for path, id := range kcs {
		if err := writeKubeconfig(path, server, c.pem, l.pki(id.file)); err != nil {
			return fmt.Errorf("kubeconfig for %s: %w", id.cn, err)
		}
	}
	return nil
}

// loadOrCreateCA loads the CA at base.crt/base.key or makes a new one.
func loadOrCreateCA(base, cn string) (*ca, error) {
	certFile, keyFile := base+".crt", base+".key"
	if cert, key, certPEM, err := loadPair(certFile, keyFile); err == nil {
		return &ca{cert: cert, key: key, pem: certPEM}, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: cn},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.AddDate(5, 0, 0),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, err
	}
	cert, _ := x509.ParseCertificate(der)
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	if err := writePair(certFile, keyFile, certPEM, key); err != nil {
		return nil, err
	}
	return &ca{cert: cert, key: key, pem: certPEM}, nil
}

func (c *ca) ensureServing(base, cn string, ips []net.IP, dns []string) error {
	return c.ensure(base, &x509.Certificate{
		Subject:     pkix.Name{CommonName: cn},
		IPAddresses: ips,
		DNSNames:    dns,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
}

func (c *ca) ensureClient(base string, id identity) error {
	return c.ensure(base, &x509.Certificate{
		Subject:     pkix.Name{CommonName: id.cn, Organization: id.groups},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
}

// ensure writes base.crt and base.key signed by c unless a pair signed by c
// is already there.
func (c *ca) ensure(base string, tmpl *x509.Certificate) error {
	if cert, _, _, err := loadPair(base+".crt", base+".key"); err == nil && cert.CheckSignatureFrom(c.cert) == nil {
		return nil
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	now := time.Now()
	tmpl.SerialNumber = serial()
	tmpl.NotBefore = now.Add(-time.Hour)
	tmpl.NotAfter = now.AddDate(1, 0, 0)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, key.Public(), c.key)
	if err != nil {
		return err
	}
	return writePair(base+".crt", base+".key", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), key)
}

func ensureSAKey(keyFile, pubFile string) error {
	if _, err := os.Stat(keyFile); err == nil {
		if _, err := os.Stat(pubFile); err == nil {
			return nil
		}
	}
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return err
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}), 0o600); err != nil {
		return err
	}
	return os.WriteFile(pubFile, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o644)
}

func loadPair(certFile, keyFile string) (*x509.Certificate, crypto.Signer, []byte, error) {
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return nil, nil, nil, err
	}
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		return nil, nil, nil, err
	}
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return nil, nil, nil, fmt.Errorf("%s or %s is not PEM; delete both to make new ones", certFile, keyFile)
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("%s: %w", certFile, err)
	}
	key, err := x509.ParseECPrivateKey(kb.Bytes)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("%s: %w", keyFile, err)
	}
	if time.Now().Add(24 * time.Hour).After(cert.NotAfter) {
		return nil, nil, nil, fmt.Errorf("%s expires at %s: %w", certFile, cert.NotAfter, os.ErrNotExist)
	}
	return cert, key, certPEM, nil
}

func writePair(certFile, keyFile string, certPEM []byte, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		return err
	}
	return os.WriteFile(certFile, certPEM, 0o644)
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	return n
}

// writeKubeconfig writes a kubeconfig for the client certificate pair at
// base.crt/base.key, with everything embedded so the file stands alone.
func writeKubeconfig(path, server string, caPEM []byte, base string) error {
	cert, err := os.ReadFile(base + ".crt")
	if err != nil {
		return err
	}
	key, err := os.ReadFile(base + ".key")
	if err != nil {
		return err
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["ms2m"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: caPEM}
	cfg.AuthInfos["ms2m"] = &clientcmdapi.AuthInfo{ClientCertificateData: cert, ClientKeyData: key}
	cfg.Contexts["ms2m"] = &clientcmdapi.Context{Cluster: "ms2m", AuthInfo: "ms2m"}
	cfg.CurrentContext = "ms2m"
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return clientcmd.WriteToFile(*cfg, path)
}
