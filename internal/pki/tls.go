package pki

import "crypto/tls"

// tlsCipherSuites are the TLS 1.2 suites netop's servers accept: ECDHE key
// exchange (forward secrecy) with an AEAD cipher. Go's defaults also offer
// the CBC suites with SHA-1 or SHA-256 MACs (Lucky13-style padding oracles,
// no AEAD); TLS 1.3 suites are all AEAD and not configurable. The AES-128
// GCM suites come first: HTTP/2 requires one of them.
var tlsCipherSuites = []uint16{
	tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
	tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
	tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
	tls.TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
	tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
	tls.TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
}

// TLSCipherSuites returns the TLS 1.2 cipher suites of netop's servers, for
// a tls.Config with MinVersion TLS 1.2.
func TLSCipherSuites() []uint16 { return append([]uint16(nil), tlsCipherSuites...) }

// TLSCipherSuiteNames returns the same suites by their IANA names, as
// kube-apiserver's --tls-cipher-suites and etcd's cipher-suites take them.
func TLSCipherSuiteNames() []string {
	names := make([]string, len(tlsCipherSuites))
	for i, id := range tlsCipherSuites {
		names[i] = tls.CipherSuiteName(id)
	}
	return names
}
