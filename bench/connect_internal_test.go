package bench

import "testing"

// TestTurns: each of the 4 ways gets its n turns, and with n a multiple of 3 each follows
// every other as often (n/3 times; one pair, the order's wrap, n/3-1).
func TestTurns(t *testing.T) {
	for _, n := range []int{1, 5, 6, 300} {
		order := turns(n)
		count := [4]int{}
		follows := [4][4]int{}
		for i, w := range order {
			count[w]++
			if i > 0 {
				follows[order[i-1]][w]++
			}
		}
		if count != [4]int{n, n, n, n} {
			t.Fatalf("n=%d: turns %v, want %d each", n, count, n)
		}
		if n%3 != 0 {
			continue
		}
		for a := range 4 {
			for b := range 4 {
				got := follows[a][b]
				switch {
				case a == b && got != 0:
					t.Errorf("n=%d: way %d follows itself %d times", n, a, got)
				case a != b && got != n/3 && got != n/3-1:
					t.Errorf("n=%d: way %d follows way %d %d times, want %d", n, b, a, got, n/3)
				}
			}
		}
	}
}
