package network

import "testing"

func TestVNIPool(t *testing.T) {
	p := newVNIPool()
	p.keep("a", 5)
	p.keep("b", 5) // taken by a: b gets another
	p.keep("c", 0) // none recorded
	p.keep("d", maxVNI+1)
	if vni, _ := p.assign("a"); vni != 5 {
		t.Errorf("a kept %d, want 5", vni)
	}
	b, _ := p.assign("b")
	c, _ := p.assign("c")
	if b == 5 || c == 5 || b == c || b < 1 || c < 1 {
		t.Errorf("b %d, c %d: each its own, not a's 5", b, c)
	}
	// A freed VNI is not the next one handed out.
	p.release("b")
	if d, _ := p.assign("d"); d == b {
		t.Errorf("d got b's VNI %d right after it was freed", d)
	}
	if again, _ := p.assign("c"); again != c {
		t.Errorf("c's VNI changed from %d to %d", c, again)
	}
}
