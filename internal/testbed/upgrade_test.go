package testbed_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/meshnode/meshnode/internal/testbed"
)

// TestReadUpgradeFrom_Refuses: a file without exactly one full hash is refused.
func TestReadUpgradeFrom_Refuses(t *testing.T) {
	for name, text := range map[string]string{
		"empty":      "# only a comment\n",
		"short hash": "c13f8d1\n",
		"two":        "c13f8d1678ca995bdbc4d165977d0c6931ba24d7\nc13f8d1678ca995bdbc4d165977d0c6931ba24d7\n",
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), testbed.UpgradeFromFile)
			os.WriteFile(path, []byte(text), 0o644)
			if rev, err := testbed.ReadUpgradeFrom(path); err == nil {
				t.Fatalf("ReadUpgradeFrom(%q) = %s, want an error", text, rev)
			}
		})
	}
}
