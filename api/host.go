package api

// LogsTool is a node's tool that reads a module's output log (`meshnode logs`):
// mesh.node.<node>.tool.logs, the operator's to call.
const LogsTool = "logs"

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
