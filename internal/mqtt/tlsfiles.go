package mqtt

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
)

// TLSFiles names PEM files for a TLS connection to the broker, read again
// at every connection (tlsConfigFor), so that a renewed certificate, key or
// CA bundle takes effect at the next reconnect without a restart. Its
// fields are those of the root package's TLSFiles, which converts to it.
type TLSFiles struct {
	// CAFile is a CA bundle to verify the broker with. Empty means the
	// system roots.
	CAFile string
	// CertFile and KeyFile are the client certificate and its key, for
	// mutual TLS. Both or neither.
	CertFile string
	KeyFile  string
	// ServerName is the name checked in the broker's certificate. Empty
	// means the host of the broker URL.
	ServerName string
}

// Config reads the files and returns a client TLS configuration: TLS 1.2 at
// least, the broker's certificate and name verified.
func (f TLSFiles) Config() (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: f.ServerName}
	if f.CAFile != "" {
		pem, err := os.ReadFile(f.CAFile)
		if err != nil {
			return nil, fmt.Errorf("outbox: CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("outbox: CA file %s: no PEM certificate in it", f.CAFile)
		}
		cfg.RootCAs = pool
	}
	if (f.CertFile == "") != (f.KeyFile == "") {
		return nil, errors.New("outbox: a client certificate needs both CertFile and KeyFile")
	}
	if f.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(f.CertFile, f.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("outbox: client certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// tlsConfigFor returns the configuration for the next connection: files are
// read afresh, a fixed configuration is used as given.
func tlsConfigFor(fixed *tls.Config, files *TLSFiles) (*tls.Config, error) {
	if files != nil {
		return files.Config()
	}
	return fixed, nil
}
