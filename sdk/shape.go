package sdk

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/meshnode/meshnode/manifest"
)

// ErrShape means a payload does not fit the shape its seat declares for the verb or tool.
var ErrShape = errors.New("payload does not fit its declared shape")

// WithShapeChecks makes Submit and Call check each payload sent to a seat against the shape
// the seat declares for the verb or tool, and refuse one that does not fit with ErrShape
// before it is sent. A holder always checks what it receives.
func WithShapeChecks() Option { return func(o *options) { o.shapes = true } }

// checkShape checks the JSON body against shape; a nil shape fits anything.
func checkShape(shape *manifest.Shape, what string, body []byte) error {
	if shape == nil {
		return nil
	}
	var v any
	if err := json.Unmarshal(body, &v); err != nil {
		return fmt.Errorf("%w: %s: the payload is not JSON: %w", ErrShape, what, err)
	}
	if err := shape.Check(v); err != nil {
		return fmt.Errorf("%w: %s: %w", ErrShape, what, err)
	}
	return nil
}
