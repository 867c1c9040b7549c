package host

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/meshnode/meshnode/manifest"
)

// LogsTool is a node's tool that reads a module's output log (`meshnode logs`):
// mesh.node.<node>.tool.logs, the operator's to call.
const LogsTool = "logs"

// MaxLogRead bounds one read of a log, so that a reply fits the bus's payload.
const MaxLogRead = 256 << 10

// LogsRequest asks for a module's output from Offset on; a negative Offset asks for the last
// -Offset bytes.
type LogsRequest struct {
	Module string `json:"module"`
	Offset int64  `json:"offset"`
}

// LogsReply is a piece of a module's output log and the offset to ask from next.
type LogsReply struct {
	Data  []byte `json:"data"`
	Next  int64  `json:"next"`
	Error string `json:"error,omitempty"`
}

// ReadLog reads module's output log under dir, from req.Offset, at most MaxLogRead bytes.
func ReadLog(dir string, req LogsRequest) (LogsReply, error) {
	if !manifest.ValidName(req.Module) {
		return LogsReply{}, fmt.Errorf("%q is not a module name", req.Module)
	}
	f, err := os.Open(filepath.Join(dir, req.Module, "output.log"))
	if errors.Is(err, os.ErrNotExist) {
		return LogsReply{}, fmt.Errorf("module %s has no output on this node: it does not run here (`meshnode ps` says where it does)", req.Module)
	}
	if err != nil {
		return LogsReply{}, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return LogsReply{}, err
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
		return LogsReply{}, err
	}
	return LogsReply{Data: data[:n], Next: from + int64(n)}, nil
}
