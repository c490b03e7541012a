// Package servingcert issues and renews the webhook's serving certificate: a
// self-signed CA and a serving certificate it signs, kept together in one
// Secret in the layout cert-controller and cert-manager use (ca.crt, ca.key,
// tls.crt, tls.key), so that a Secret written by an earlier version, or by
// cert-manager, is read as is.
//
// It is the pure part of the webhook binary's --mode=cert-rotator: given the
// Secret's data and the time, what the data must become and what the
// webhook configurations' caBundle must hold. The data crosses a trust
// boundary (whoever may write the Secret writes it), so every value is
// bounded in size before it is parsed, and anything that does not parse,
// verify or last long enough is replaced, never trusted.
package servingcert

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// The Secret's keys.
const (
	CACertKey = "ca.crt"
	CAKeyKey  = "ca.key"
	// PreviousCACertKey keeps the CA a renewal replaced, for as long as it is
	// valid: the caBundle trusts both, so a replica still serving the old
	// certificate (the kubelet refreshes a mounted Secret only every minute
	// or so) is still believed while the new one reaches it.
	PreviousCACertKey = "ca-previous.crt"
	CertKey           = corev1.TLSCertKey       // tls.crt
	KeyKey            = corev1.TLSPrivateKeyKey // tls.key
)

// MaxValueBytes bounds each value read from the Secret: a PEM certificate or
// key is a few KiB, and a larger value is replaced without being parsed.
const MaxValueBytes = 64 << 10

// Defaults of an Issuer's validity periods.
const (
	DefaultCAValidity   = 10 * 365 * 24 * time.Hour
	DefaultCertValidity = 365 * 24 * time.Hour
	// DefaultRenewBefore renews a certificate 90 days before it expires, as
	// cert-controller did.
	DefaultRenewBefore = 90 * 24 * time.Hour
)

// Issuer describes the certificates to keep.
type Issuer struct {
	// CAName is the CA's common name.
	CAName string
	// Organization is the CA's organization.
	Organization string
	// DNSNames are the serving certificate's names; the first is its common
	// name. A certificate that does not cover all of them is reissued.
	DNSNames []string
	// Validity of a new CA and a new serving certificate, and how long
	// before expiry either is renewed; zero: the defaults.
	CAValidity, CertValidity, RenewBefore time.Duration
}

// Renewal says what Ensure renewed, and why.
type Renewal struct {
	CA, Cert bool
	// Reason is why, for logs and Events, e.g. "tls.crt: expires 2027-01-02T00:00:00Z, renewed 2160h0m0s before".
	Reason string
}

// Ensure returns the data the Secret must hold at now: nil when data is
// current (a valid CA and a serving certificate it signed for every DNS name,
// neither expiring within RenewBefore), else a copy of data with what is
// missing or stale replaced. Keys other than the ones it manages are kept.
func (is *Issuer) Ensure(data map[string][]byte, now time.Time) (map[string][]byte, Renewal, error) {
	if len(is.DNSNames) == 0 || is.CAName == "" {
		return nil, Renewal{}, errors.New("servingcert: an Issuer needs a CA name and at least one DNS name")
	}
	ca, caErr := is.parseCA(data, now)
	var r Renewal
	if caErr != nil {
		r.CA, r.Cert = true, true
		r.Reason = caErr.Error()
	} else if err := is.checkServing(data, ca, now); err != nil {
		r.Cert = true
		r.Reason = err.Error()
	}
	previous, previousValid := validPreviousCA(data, now)
	if !r.CA && !r.Cert {
		if _, present := data[PreviousCACertKey]; present && !previousValid {
			// An expired previous CA goes; nothing else changes.
			out := copyData(data)
			delete(out, PreviousCACertKey)
			return out, Renewal{Reason: PreviousCACertKey + ": expired"}, nil
		}
		return nil, Renewal{}, nil
	}
	out := copyData(data)
	if r.CA {
		// The CA being replaced stays trusted while it is valid.
		if old, err := parseCertificate(data[CACertKey]); err == nil && now.Before(old.NotAfter) {
			out[PreviousCACertKey] = data[CACertKey]
		} else {
			delete(out, PreviousCACertKey)
		}
		var err error
		if ca, err = is.newCA(now); err != nil {
			return nil, Renewal{}, err
		}
		out[CACertKey], out[CAKeyKey] = ca.certPEM, ca.keyPEM
	} else if !previousValid {
		delete(out, PreviousCACertKey)
	} else {
		out[PreviousCACertKey] = previous
	}
	cert, key, err := is.newServing(ca, now)
	if err != nil {
		return nil, Renewal{}, err
	}
	out[CertKey], out[KeyKey] = cert, key
	return out, r, nil
}

// Bundle is the caBundle the webhook configurations must carry for data: the
// CA, and the previous CA while it is valid at now. Nil when data holds no
// valid CA (nothing to inject yet).
func Bundle(data map[string][]byte, now time.Time) []byte {
	ca, err := parseCertificate(data[CACertKey])
	if err != nil || !now.Before(ca.NotAfter) {
		return nil
	}
	bundle := append([]byte(nil), data[CACertKey]...)
	if previous, ok := validPreviousCA(data, now); ok {
		if len(bundle) > 0 && bundle[len(bundle)-1] != '\n' {
			bundle = append(bundle, '\n')
		}
		bundle = append(bundle, previous...)
	}
	return bundle
}

// NextCheck is when data next needs renewing: the earliest expiry of the CA,
// the serving certificate or the previous CA, less RenewBefore for the first
// two. The zero time when data does not parse (renew now).
func (is *Issuer) NextCheck(data map[string][]byte) time.Time {
	var next time.Time
	earliest := func(t time.Time) {
		if next.IsZero() || t.Before(next) {
			next = t
		}
	}
	for _, k := range []string{CACertKey, CertKey} {
		c, err := parseCertificate(data[k])
		if err != nil {
			return time.Time{}
		}
		earliest(c.NotAfter.Add(-is.renewBefore()))
	}
	if c, err := parseCertificate(data[PreviousCACertKey]); err == nil {
		earliest(c.NotAfter)
	}
	return next
}

// NotAfter is when the serving certificate in data expires; zero if it does
// not parse.
func NotAfter(data map[string][]byte) time.Time {
	c, err := parseCertificate(data[CertKey])
	if err != nil {
		return time.Time{}
	}
	return c.NotAfter
}

func (is *Issuer) renewBefore() time.Duration {
	if is.RenewBefore > 0 {
		return is.RenewBefore
	}
	return DefaultRenewBefore
}

type keyPair struct {
	cert    *x509.Certificate
	key     crypto.Signer
	certPEM []byte
	keyPEM  []byte
}

// parseCA reads and checks the CA: a self-signed CA certificate, valid at now
// and beyond the renewal window, whose key is ca.key.
func (is *Issuer) parseCA(data map[string][]byte, now time.Time) (*keyPair, error) {
	renewAt := now.Add(is.renewBefore())
	cert, err := parseCertificate(data[CACertKey])
	if err != nil {
		return nil, fmt.Errorf("%s: %w", CACertKey, err)
	}
	if !cert.IsCA || cert.CheckSignatureFrom(cert) != nil {
		return nil, fmt.Errorf("%s: not a self-signed CA", CACertKey)
	}
	if now.Before(cert.NotBefore) || !renewAt.Before(cert.NotAfter) {
		return nil, fmt.Errorf("%s: valid %s to %s, renewed %s before it expires", CACertKey,
			cert.NotBefore.UTC().Format(time.RFC3339), cert.NotAfter.UTC().Format(time.RFC3339), is.renewBefore())
	}
	key, err := parsePrivateKey(data[CAKeyKey])
	if err != nil {
		return nil, fmt.Errorf("%s: %w", CAKeyKey, err)
	}
	if !publicKeysEqual(cert.PublicKey, key.Public()) {
		return nil, fmt.Errorf("%s: not the key of %s", CAKeyKey, CACertKey)
	}
	return &keyPair{cert: cert, key: key, certPEM: data[CACertKey], keyPEM: data[CAKeyKey]}, nil
}

// checkServing checks the serving certificate: its key is tls.key, the CA
// signed it for server use and every DNS name, and it is valid at now and
// beyond the renewal window.
func (is *Issuer) checkServing(data map[string][]byte, ca *keyPair, now time.Time) error {
	renewAt := now.Add(is.renewBefore())
	if len(data[CertKey]) > MaxValueBytes || len(data[KeyKey]) > MaxValueBytes {
		return fmt.Errorf("%s or %s: larger than %d bytes", CertKey, KeyKey, MaxValueBytes)
	}
	pair, err := tls.X509KeyPair(data[CertKey], data[KeyKey])
	if err != nil {
		return fmt.Errorf("%s/%s: %w", CertKey, KeyKey, err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return fmt.Errorf("%s: %w", CertKey, err)
	}
	if !renewAt.Before(leaf.NotAfter) {
		return fmt.Errorf("%s: expires %s, renewed %s before", CertKey, leaf.NotAfter.UTC().Format(time.RFC3339), is.renewBefore())
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.cert)
	for _, name := range is.DNSNames {
		if _, err := leaf.Verify(x509.VerifyOptions{DNSName: name, Roots: roots, CurrentTime: now,
			KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
			return fmt.Errorf("%s: not valid for %s from this CA: %w", CertKey, name, err)
		}
	}
	return nil
}

func validPreviousCA(data map[string][]byte, now time.Time) ([]byte, bool) {
	c, err := parseCertificate(data[PreviousCACertKey])
	if err != nil || !c.IsCA || !now.Before(c.NotAfter) {
		return nil, false
	}
	return data[PreviousCACertKey], true
}

func (is *Issuer) newCA(now time.Time) (*keyPair, error) {
	validity := is.CAValidity
	if validity <= 0 {
		validity = DefaultCAValidity
	}
	templ := &x509.Certificate{
		Subject:               pkix.Name{CommonName: is.CAName, Organization: []string{is.Organization}},
		NotBefore:             now.Add(-time.Hour), // clock skew between nodes
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	return issue(templ, nil)
}

func (is *Issuer) newServing(ca *keyPair, now time.Time) (certPEM, keyPEM []byte, err error) {
	validity := is.CertValidity
	if validity <= 0 {
		validity = DefaultCertValidity
	}
	notAfter := now.Add(validity)
	if notAfter.After(ca.cert.NotAfter) {
		notAfter = ca.cert.NotAfter
	}
	templ := &x509.Certificate{
		Subject:               pkix.Name{CommonName: is.DNSNames[0]},
		DNSNames:              is.DNSNames,
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
	}
	kp, err := issue(templ, ca)
	if err != nil {
		return nil, nil, err
	}
	return kp.certPEM, kp.keyPEM, nil
}

// issue makes an ECDSA P-256 key and a certificate for it from templ, signed
// by parent (self-signed when nil), with a random serial number.
func issue(templ *x509.Certificate, parent *keyPair) (*keyPair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	if templ.SerialNumber, err = rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127)); err != nil {
		return nil, err
	}
	signerCert, signer := templ, crypto.Signer(key)
	if parent != nil {
		signerCert, signer = parent.cert, parent.key
	}
	der, err := x509.CreateCertificate(rand.Reader, templ, signerCert, key.Public(), signer)
	if err != nil {
		return nil, fmt.Errorf("creating the certificate %q: %w", templ.Subject.CommonName, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	return &keyPair{
		cert: cert, key: key,
		certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		keyPEM:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
	}, nil
}

// parseCertificate parses the first PEM certificate of b.
func parseCertificate(b []byte) (*x509.Certificate, error) {
	if len(b) == 0 {
		return nil, errors.New("missing")
	}
	if len(b) > MaxValueBytes {
		return nil, fmt.Errorf("larger than %d bytes", MaxValueBytes)
	}
	block, _ := pem.Decode(b)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, errors.New("not a PEM certificate")
	}
	return x509.ParseCertificate(block.Bytes)
}

// parsePrivateKey parses a PEM private key: PKCS #8 (what this package
// writes), PKCS #1 RSA (cert-controller's) or SEC 1 EC.
func parsePrivateKey(b []byte) (crypto.Signer, error) {
	if len(b) == 0 {
		return nil, errors.New("missing")
	}
	if len(b) > MaxValueBytes {
		return nil, fmt.Errorf("larger than %d bytes", MaxValueBytes)
	}
	block, _ := pem.Decode(b)
	if block == nil {
		return nil, errors.New("not a PEM key")
	}
	switch block.Type {
	case "RSA PRIVATE KEY":
		return x509.ParsePKCS1PrivateKey(block.Bytes)
	case "EC PRIVATE KEY":
		return x509.ParseECPrivateKey(block.Bytes)
	case "PRIVATE KEY":
		k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
		if err != nil {
			return nil, err
		}
		if s, ok := k.(crypto.Signer); ok {
			return s, nil
		}
		return nil, fmt.Errorf("a %T cannot sign", k)
	}
	return nil, fmt.Errorf("unsupported PEM block %q", block.Type)
}

func publicKeysEqual(a, b crypto.PublicKey) bool {
	switch a := a.(type) {
	case *rsa.PublicKey:
		return a.Equal(b)
	case *ecdsa.PublicKey:
		return a.Equal(b)
	}
	ab, errA := x509.MarshalPKIXPublicKey(a)
	bb, errB := x509.MarshalPKIXPublicKey(b)
	return errA == nil && errB == nil && bytes.Equal(ab, bb)
}

func copyData(data map[string][]byte) map[string][]byte {
	out := make(map[string][]byte, len(data)+4)
	for k, v := range data {
		out[k] = v
	}
	return out
}
