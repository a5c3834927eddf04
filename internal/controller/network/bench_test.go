package network

import (
	"context"
	"testing"

	"k8s.io/client-go/tools/cache"
)

// A sync of a Network that is already right: no write, no change, and few
// allocations.
func BenchmarkSyncUnchanged(b *testing.B) {
	n := readyNetwork(network("n", "192.168.0.0/16", "192.168.0.1"))
	f := newFixture(b, n)
	f.inBackend(n)
	name := cache.MetaObjectToName(n)
	b.ReportAllocs()
	for b.Loop() {
		if err := f.controller.sync(context.Background(), name); err != nil {
			b.Fatal(err)
		}
	}
	if actions := f.client.Actions(); len(actions) != 0 {
		b.Fatalf("a sync of an unchanged Network sent %d requests, first %v", len(actions), actions[0])
	}
}
