package api

import "time"

// ArchiveRequest asks the mesh-git holder to put a commit's tree into mesh-sources.
type ArchiveRequest struct {
	Repository string `json:"repository"`
	Commit     string `json:"commit"`
}

// ChangedRequest asks which paths commit changed since before.
type ChangedRequest struct {
	Repository string `json:"repository"`
	Before     string `json:"before,omitempty"`
	Commit     string `json:"commit"`
}

// GitReply answers both: the object name, or the paths.
type GitReply struct {
	Object string   `json:"object,omitempty"`
	Paths  []string `json:"paths,omitempty"`
	Error  string   `json:"error,omitempty"`
}

// BuilderStatus answers the mesh-build-machine seat's status tool: the build running now.
type BuilderStatus struct {
	Module  string    `json:"module,omitempty"`
	Commit  string    `json:"commit,omitempty"`
	Cascade string    `json:"cascade,omitempty"`
	Since   time.Time `json:"since,omitzero"`
}
