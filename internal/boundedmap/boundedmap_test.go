package boundedmap

import "testing"

// TestMap_Bound: a Map keeps what it is given up to its bound, then starts again.
func TestMap_Bound(t *testing.T) {
	m := New[string, int](2)
	m.Put("a", 1)
	m.Put("b", 2)
	m.Put("b", 3) // a replacement takes no room
	if v, ok := m.Get("a"); !ok || v != 1 {
		t.Fatalf("a: %v %v", v, ok)
	}
	m.Put("c", 4)
	if _, ok := m.Get("a"); ok {
		t.Fatal("past its bound the map kept the others")
	}
	if v, ok := m.Get("c"); !ok || v != 4 {
		t.Fatalf("c: %v %v", v, ok)
	}
}
