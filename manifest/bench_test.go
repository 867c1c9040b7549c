package manifest_test

import (
	"math/rand"
	"testing"

	"github.com/meshnode/meshnode/manifest"
)

// BenchmarkCatalogue validates and derives a catalogue of 1,000 generated modules; one op is
// the whole catalogue. Run: go test -run '^$' -bench . ./manifest/
func BenchmarkCatalogue(b *testing.B) {
	g := generator{r: rand.New(rand.NewSource(1000)), size: 6}
	ms := g.catalogue(1000)
	yamls := make([][]byte, len(ms))
	for i, m := range ms {
		yamls[i] = marshal(m)
	}

	b.Run("validate+derive", func(b *testing.B) {
		for b.Loop() {
			for _, m := range ms {
				if _, err := m.Derive(); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
	b.Run("parse+validate+derive", func(b *testing.B) {
		for b.Loop() {
			for _, data := range yamls {
				m, err := manifest.Parse(data)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := m.Derive(); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
	b.Run("check-against-catalogue", func(b *testing.B) {
		for b.Loop() {
			for _, m := range ms {
				manifest.CheckCatalogue(m, ms, m)
			}
		}
	})
}
