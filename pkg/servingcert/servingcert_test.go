package servingcert

import (
	"bytes"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/resclass/resclass/pkg/internal/watchdog"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func testIssuer() *Issuer {
	return &Issuer{
		CAName: "resclass-webhook-ca", Organization: "resclass",
		DNSNames:   []string{"resclass-webhook.resclass-system.svc", "resclass-webhook.resclass-system.svc.cluster.local"},
		CAValidity: 1000 * time.Hour, CertValidity: 100 * time.Hour, RenewBefore: 10 * time.Hour,
	}
}

// mustEnsure runs Ensure and checks that what it returns is current: a
// second Ensure at the same time changes nothing, and the served pair
// verifies against the bundle for every name.
func mustEnsure(t *testing.T, is *Issuer, data map[string][]byte, now time.Time) (map[string][]byte, Renewal) {
	t.Helper()
	out, r, err := is.Ensure(data, now)
	if err != nil {
		t.Fatal(err)
	}
	current := data
	if out != nil {
		current = out
	}
	if again, r2, err := is.Ensure(current, now); err != nil || again != nil {
		t.Fatalf("not current after Ensure: %v, %+v", err, r2)
	}
	verifies(t, is, current, now)
	return out, r
}

func verifies(t *testing.T, is *Issuer, data map[string][]byte, now time.Time) {
	t.Helper()
	pair, err := tls.X509KeyPair(data[CertKey], data[KeyKey])
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := x509.ParseCertificate(pair.Certificate[0])
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(Bundle(data, now)) {
		t.Fatal("no CA in the bundle")
	}
	for _, n := range is.DNSNames {
		if _, err := leaf.Verify(x509.VerifyOptions{DNSName: n, Roots: roots, CurrentTime: now}); err != nil {
			t.Errorf("%s: %v", n, err)
		}
	}
}

func TestEnsureLifecycle(t *testing.T) {
	is := testIssuer()
	// An empty Secret (deploy/webhook/secret.yaml) gets a CA and a certificate;
	// keys it does not manage stay.
	data, r := mustEnsure(t, is, map[string][]byte{"other": []byte("kept")}, t0)
	if !r.CA || !r.Cert || data == nil || string(data["other"]) != "kept" {
		t.Fatalf("first issue: %+v %v", r, data)
	}
	if _, ok := data[PreviousCACertKey]; ok {
		t.Error("a first CA has no previous CA")
	}
	if got := is.NextCheck(data); !got.Equal(NotAfter(data).Add(-is.RenewBefore)) {
		t.Errorf("NextCheck %s, want the certificate's renewal %s", got, NotAfter(data).Add(-is.RenewBefore))
	}

	// Inside the certificate's renewal window: a new certificate, same CA.
	now := NotAfter(data).Add(-is.RenewBefore + time.Minute)
	renewed, r := mustEnsure(t, is, data, now)
	if r.CA || !r.Cert || !strings.Contains(r.Reason, "tls.crt: expires") {
		t.Errorf("certificate renewal: %+v", r)
	}
	if !bytes.Equal(renewed[CACertKey], data[CACertKey]) || bytes.Equal(renewed[CertKey], data[CertKey]) {
		t.Error("the certificate should change and the CA stay")
	}

	// Inside the CA's renewal window: a new CA, and the old one stays in the
	// bundle while it is valid, so the certificate still served verifies. (A
	// certificate as long-lived as its CA, to have one still valid then.)
	long := testIssuer()
	long.CertValidity = long.CAValidity
	renewed, _ = mustEnsure(t, long, nil, t0)
	ca, _ := parseCertificate(renewed[CACertKey])
	now = ca.NotAfter.Add(-is.RenewBefore + time.Minute)
	rotated, r := mustEnsure(t, long, renewed, now)
	if !r.CA || !r.Cert {
		t.Fatalf("CA renewal: %+v", r)
	}
	if !bytes.Equal(rotated[PreviousCACertKey], renewed[CACertKey]) {
		t.Error("the replaced CA is not kept as the previous CA")
	}
	bundle := Bundle(rotated, now)
	if !bytes.Contains(bundle, renewed[CACertKey]) || !bytes.Contains(bundle, rotated[CACertKey]) {
		t.Error("the bundle must trust the new and the previous CA")
	}
	oldServing := map[string][]byte{CertKey: renewed[CertKey], KeyKey: renewed[KeyKey], CACertKey: rotated[CACertKey], PreviousCACertKey: rotated[PreviousCACertKey]}
	verifies(t, long, oldServing, now)

	// Once the previous CA has expired it leaves the Secret and the bundle.
	after := ca.NotAfter.Add(time.Minute)
	cleaned, r := mustEnsure(t, is, rotated, after)
	if r.CA || r.Cert || cleaned == nil {
		t.Fatalf("expired previous CA: %+v", r)
	}
	if _, ok := cleaned[PreviousCACertKey]; ok {
		t.Error("the expired previous CA is still there")
	}
	if bytes.Contains(Bundle(rotated, after), renewed[CACertKey]) {
		t.Error("an expired previous CA is still in the bundle")
	}
}

func TestEnsureReplacesWhatDoesNotHold(t *testing.T) {
	is := testIssuer()
	good, _ := mustEnsure(t, is, nil, t0)
	other, _ := mustEnsure(t, is, nil, t0)
	for _, tc := range []struct {
		name           string
		change         func(map[string][]byte)
		wantCA         bool
		wantReasonPart string
		// A CA certificate that still parses and is valid stays trusted as
		// the previous CA (certificates it signed are still served).
		wantPrevious bool
	}{
		{"a CA that does not parse (the e2e test's corruption)", func(d map[string][]byte) { d[CACertKey] = []byte("not a certificate") }, true, "ca.crt: not a PEM certificate", false},
		{"a CA key of another CA", func(d map[string][]byte) { d[CAKeyKey] = other[CAKeyKey] }, true, "ca.key: not the key of ca.crt", true},
		{"a huge CA", func(d map[string][]byte) { d[CACertKey] = bytes.Repeat([]byte("A"), MaxValueBytes+1) }, true, "larger than", false},
		{"a certificate of another CA", func(d map[string][]byte) { d[CertKey], d[KeyKey] = other[CertKey], other[KeyKey] }, false, "not valid for", false},
		{"a key that is not the certificate's", func(d map[string][]byte) { d[KeyKey] = other[KeyKey] }, false, "tls.crt/tls.key", false},
		{"no certificate", func(d map[string][]byte) { delete(d, CertKey) }, false, "tls.crt/tls.key", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := copyData(good)
			tc.change(d)
			out, r := mustEnsure(t, is, d, t0)
			if out == nil || r.CA != tc.wantCA || !r.Cert || !strings.Contains(r.Reason, tc.wantReasonPart) {
				t.Errorf("got %+v, want CA renewal %v and a reason with %q", r, tc.wantCA, tc.wantReasonPart)
			}
			if _, ok := out[PreviousCACertKey]; ok != tc.wantPrevious {
				t.Errorf("previous CA kept: %v, want %v", ok, tc.wantPrevious)
			}
		})
	}

	t.Run("a new DNS name reissues the certificate, not the CA", func(t *testing.T) {
		more := testIssuer()
		more.DNSNames = append(more.DNSNames, "localhost")
		out, r := mustEnsure(t, more, good, t0)
		if out == nil || r.CA || !r.Cert || !strings.Contains(r.Reason, "localhost") {
			t.Errorf("%+v", r)
		}
	})
}

// A Secret cert-controller wrote (RSA, PKCS #1) keeps its CA after an upgrade.
func TestEnsureKeepsACertControllerCA(t *testing.T) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	templ := &x509.Certificate{SerialNumber: big.NewInt(0), Subject: pkix.Name{CommonName: "resclass-webhook-ca"},
		NotBefore: t0.Add(-time.Hour), NotAfter: t0.Add(10 * 365 * 24 * time.Hour),
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature, BasicConstraintsValid: true, IsCA: true}
	der, err := x509.CreateCertificate(rand.Reader, templ, templ, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	data := map[string][]byte{
		CACertKey: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		CAKeyKey:  pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}),
	}
	out, r := mustEnsure(t, testIssuer(), data, t0)
	if r.CA || !r.Cert || !bytes.Equal(out[CACertKey], data[CACertKey]) {
		t.Errorf("the RSA CA should sign a new certificate, not be replaced: %+v", r)
	}
}

// FuzzEnsure: whatever the Secret holds, Ensure returns data that is current
// (a second call changes nothing) or an error, without panicking, and the
// bundle and NextCheck read it without panicking.
func FuzzEnsure(f *testing.F) {
	is := testIssuer()
	good, _, err := is.Ensure(nil, t0)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good[CACertKey], good[CAKeyKey], good[CertKey], good[KeyKey], good[CACertKey])
	f.Add([]byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"), []byte{}, []byte{}, []byte{}, []byte{})
	f.Add(good[CACertKey], good[KeyKey], good[CertKey], good[CAKeyKey], good[CertKey])
	f.Fuzz(func(t *testing.T, caCert, caKey, cert, key, previous []byte) {
		watchdog.Run(t, func() {
			data := map[string][]byte{CACertKey: caCert, CAKeyKey: caKey, CertKey: cert, KeyKey: key, PreviousCACertKey: previous}
			_ = Bundle(data, t0)
			_ = is.NextCheck(data)
			out, _, err := is.Ensure(data, t0)
			if err != nil {
				t.Fatal(err)
			}
			if out == nil {
				return
			}
			if again, r, err := is.Ensure(out, t0); err != nil || again != nil {
				t.Fatalf("not current after Ensure: %v %+v", err, r)
			}
		})
	})
}
