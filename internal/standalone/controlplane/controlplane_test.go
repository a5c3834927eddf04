package controlplane

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	pkiutil "github.com/netop-dev/netop/internal/pki"
)

// The PKI is made once and reused: a second ensurePKI changes no file. A
// certificate no longer signed by its CA (the CA was deleted and made
// anew) is issued again.
func TestPKIReused(t *testing.T) {
	dir := t.TempDir()
	if _, err := ensurePKI(dir); err != nil {
		t.Fatal(err)
	}
	files := []string{caCertFile, caKeyFile, servingCertFile, servingKeyFile, saKeyFile, tokenFile,
		etcdCACertFile, etcdCAKeyFile, etcdServerCertFile, etcdServerKeyFile, etcdClientCertFile, etcdClientKeyFile,
		kubeletClientCertFile, kubeletClientKeyFile}
	read := func() map[string][]byte {
		out := map[string][]byte{}
		for _, f := range files {
			data, err := os.ReadFile(filepath.Join(dir, f))
			if err != nil {
				t.Fatal(err)
			}
			out[f] = data
		}
		return out
	}
	first := read()
	p, err := ensurePKI(dir)
	if err != nil {
		t.Fatal(err)
	}
	for f, data := range read() {
		if !bytes.Equal(data, first[f]) {
			t.Errorf("%s changed on the second start", f)
		}
	}
	if !signedBy(first[etcdClientCertFile], p.etcdCAPEM) || signedBy(first[etcdClientCertFile], p.caPEM) {
		t.Error("the API server's etcd client certificate is not signed by etcd's CA alone")
	}

	for _, f := range []string{etcdCACertFile, etcdCAKeyFile} {
		if err := os.Remove(filepath.Join(dir, f)); err != nil {
			t.Fatal(err)
		}
	}
	p, err = ensurePKI(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{etcdServerCertFile, etcdClientCertFile} {
		cert, _ := os.ReadFile(filepath.Join(dir, f))
		if !signedBy(cert, p.etcdCAPEM) {
			t.Errorf("%s is not signed by the new etcd CA", f)
		}
	}
	if now, _ := os.ReadFile(filepath.Join(dir, servingCertFile)); !bytes.Equal(now, first[servingCertFile]) {
		t.Error("the API server's certificate changed with etcd's CA")
	}
}

// The whole control plane starts with etcd behind TLS and client
// certificates: plaintext, TLS without a certificate and a certificate of
// another CA are refused; the API server's client certificate reads. etcd
// and kube-apiserver speak TLS 1.3, or TLS 1.2 with AEAD suites, only.
func TestEtcdRequiresClientCertificates(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane")
	}
	dir := t.TempDir()
	cp, err := Start(t.Context(), Config{DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer cp.Stop()
	kube := kubernetes.NewForConfigOrDie(cp.AdminConfig())
	if _, err := kube.CoreV1().Namespaces().Get(t.Context(), "default", metav1.GetOptions{}); err != nil {
		t.Fatalf("the API server does not read from etcd: %v", err)
	}
	checkScheduler(t, kube)
	etcdURL, err := url.Parse(cp.etcdURL)
	if err != nil || etcdURL.Scheme != "https" {
		t.Fatalf("etcd serves on %q, want https", cp.etcdURL)
	}
	pkiDir := filepath.Join(cp.DataDir, "pki")
	etcdCA := x509.NewCertPool()
	if ca, err := os.ReadFile(filepath.Join(pkiDir, etcdCACertFile)); err != nil || !etcdCA.AppendCertsFromPEM(ca) {
		t.Fatalf("etcd CA: %v", err)
	}
	clientCert, err := tls.LoadX509KeyPair(filepath.Join(pkiDir, etcdClientCertFile), filepath.Join(pkiDir, etcdClientKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	otherCert := certOfAnotherCA(t)

	// Plaintext HTTP (etcd's JSON gateway) gets no data.
	if resp, err := http.Post("http://"+etcdURL.Host+"/v3/kv/range", "application/json", strings.NewReader(`{"key":"Lw==","range_end":"MA=="}`)); err == nil {
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode == http.StatusOK || bytes.Contains(body, []byte("kvs")) {
			t.Errorf("plaintext HTTP read etcd: %d %.200s", resp.StatusCode, body)
		}
	}
	// The JSON gateway over TLS without a client certificate is refused.
	insecure := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: etcdCA, MinVersion: tls.VersionTLS12}}}
	if resp, err := insecure.Post("https://"+etcdURL.Host+"/v3/kv/range", "application/json", strings.NewReader(`{"key":"Lw==","range_end":"MA=="}`)); err == nil {
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		t.Errorf("HTTPS without a client certificate read etcd: %d %.200s", resp.StatusCode, body)
	}

	// gRPC, as etcdctl and the API server speak it.
	get := func(tlsConfig *tls.Config, endpoint string) error {
		c, err := clientv3.New(clientv3.Config{
			Endpoints: []string{endpoint}, TLS: tlsConfig, DialTimeout: 2 * time.Second, Logger: zap.NewNop(),
		})
		if err != nil {
			return err
		}
		defer func() { _ = c.Close() }()
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
		defer cancel()
		resp, err := c.Get(ctx, "/registry/namespaces/default")
		if err == nil && resp.Count != 1 {
			t.Errorf("the default namespace is not in etcd: %+v", resp)
		}
		return err
	}
	base := &tls.Config{RootCAs: etcdCA, MinVersion: tls.VersionTLS12}
	withCert := func(cert tls.Certificate) *tls.Config {
		c := base.Clone()
		c.Certificates = []tls.Certificate{cert}
		return c
	}
	var wg sync.WaitGroup
	for name, tc := range map[string]struct {
		tls      *tls.Config
		endpoint string
		ok       bool
	}{
		"plaintext":                   {nil, "http://" + etcdURL.Host, false},
		"TLS without a certificate":   {base, cp.etcdURL, false},
		"a certificate of another CA": {withCert(otherCert), cp.etcdURL, false},
		"the API server's":            {withCert(clientCert), cp.etcdURL, true},
	} {
		wg.Go(func() {
			if err := get(tc.tls, tc.endpoint); (err == nil) != tc.ok {
				t.Errorf("etcd client, %s: error %v, want success=%v", name, err, tc.ok)
			}
		})
	}
	wg.Wait()

	// What refuses them is the TLS handshake, for want of a certificate of
	// etcd's CA.
	for name, cfg := range map[string]*tls.Config{"no": base, "another CA's": withCert(otherCert)} {
		conn, err := tls.Dial("tcp", etcdURL.Host, cfg)
		if err == nil {
			// TLS 1.3: the server's verdict on the client's certificate
			// arrives after the client's side of the handshake.
			_, err = conn.Read(make([]byte, 1))
			_ = conn.Close()
		}
		if err == nil || !strings.Contains(err.Error(), "certificate") {
			t.Errorf("TLS to etcd with %s certificate: %v, want a refusal of the certificate", name, err)
		}
	}

	// TLS 1.2 only with AEAD suites, on etcd and kube-apiserver.
	apiURL, _ := url.Parse(cp.URL)
	for _, addr := range []string{etcdURL.Host, apiURL.Host} {
		for _, tc := range []struct {
			suite uint16
			ok    bool
		}{
			{tls.TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA, false},
			{tls.TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA, false},
			{tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, true},
			{tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256, true},
		} {
			cfg := withCert(clientCert)
			cfg.InsecureSkipVerify = true //nolint:gosec // only the cipher suite is under test
			cfg.MaxVersion, cfg.CipherSuites = tls.VersionTLS12, []uint16{tc.suite}
			conn, err := tls.Dial("tcp", addr, cfg)
			if (err == nil) != tc.ok {
				t.Errorf("%s, TLS 1.2 with only %s: error %v, want accepted=%v", addr, tls.CipherSuiteName(tc.suite), err, tc.ok)
			}
			if err == nil {
				_ = conn.Close()
			}
		}
	}
}

// certOfAnotherCA returns a client certificate signed by a CA etcd does not
// trust.
func certOfAnotherCA(t *testing.T) tls.Certificate {
	t.Helper()
	caKey, err := pkiutil.NewKeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	ca, err := pkiutil.NewCAPEM("other", caKey)
	if err != nil {
		t.Fatal(err)
	}
	key, err := pkiutil.NewKeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	cert, err := etcdClientCert.Sign(ca, caKey, key)
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair(cert, key)
	if err != nil {
		t.Fatal(err)
	}
	return pair
}

// checkScheduler: a pod without a node is looked at by kube-scheduler,
// which finds no node for it yet (nodes come with the standalone's node).
func checkScheduler(t *testing.T, kube kubernetes.Interface) {
	t.Helper()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "unscheduled"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		// The default ServiceAccount comes from kube-controller-manager.
		_, err := kube.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{})
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("creating a pod: %v", err)
	}
	var last []corev1.PodCondition
	err = wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		got, err := kube.CoreV1().Pods("default").Get(ctx, "unscheduled", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		last = got.Status.Conditions
		for _, c := range got.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("kube-scheduler did not look at the pod: conditions %+v: %v", last, err)
	}
}

// The ports recorded for the next start are below the kernel's ephemeral
// range, which outgoing connections take theirs from.
func TestFreePortIsNotEphemeral(t *testing.T) {
	start := ephemeralStart()
	for range 20 {
		port, err := freePort()
		if err != nil {
			t.Fatal(err)
		}
		if port >= start || port < 10000 {
			t.Fatalf("port %d: want one in [10000, %d)", port, start)
		}
	}
}
