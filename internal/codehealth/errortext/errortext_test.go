package errortext_test

import (
	"testing"

	"github.com/meshnode/meshnode/internal/codehealth/errortext"
	"golang.org/x/tools/go/analysis/analysistest"
)

// TestAnalyzer: the cases in testdata/src/a are reported, each where its want comment says,
// and nothing else is.
func TestAnalyzer(t *testing.T) {
	analysistest.Run(t, analysistest.TestData(), errortext.Analyzer, "a")
}
