package host

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/manifest"
)

// MaxLogRead bounds one read of a log, so that a reply fits the bus's payload.
const MaxLogRead = 256 << 10

// ReadLog reads module's output log under dir, from req.Offset, at most MaxLogRead bytes.
func ReadLog(dir string, req api.LogsRequest) (api.LogsReply, error) {
	if !manifest.ValidName(req.Module) {
		return api.LogsReply{}, fmt.Errorf("%q is not a module name", req.Module)
	}
	f, err := os.Open(filepath.Join(dir, req.Module, "output.log"))
	if errors.Is(err, os.ErrNotExist) {
		return api.LogsReply{}, fmt.Errorf("module %s has no output on this node: it does not run here (`meshnode ps` says where it does)", req.Module)
	}
	if err != nil {
		return api.LogsReply{}, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return api.LogsReply{}, err
	}
	from := req.Offset
	if from < 0 {
		from = max(st.Size()+from, 0)
	}
	if from > st.Size() {
		from = 0 // the log was rotated: start over
	}
	data := make([]byte, min(st.Size()-from, MaxLogRead))
	n, err := f.ReadAt(data, from)
	if err != nil && !errors.Is(err, io.EOF) {
		return api.LogsReply{}, err
	}
	return api.LogsReply{Data: data[:n], Next: from + int64(n)}, nil
}
