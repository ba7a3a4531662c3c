package contract

// NodeCapabilities is what a node agent reports about its node (GET
// /v1/node): whether its container runtime can checkpoint a container and
// restore one. A field the agent could not find out is left empty (nil
// for the booleans): unknown is never a refusal.
type NodeCapabilities struct {
	// Node is the node's name, as its agent was asked.
	Node string `json:"node,omitempty"`
	// Runtime and RuntimeVersion are the CRI runtime's name and version,
	// as its Version call answers (containerd, cri-o).
	Runtime        string `json:"runtime,omitempty"`
	RuntimeVersion string `json:"runtimeVersion,omitempty"`
	// CRIU is CRIU's version on the node; CRIUFound says whether the
	// agent found it (nil: not checked, MS2M_AGENT_CRIU_PATH not set).
	CRIUFound *bool  `json:"criuFound,omitempty"`
	CRIU      string `json:"criu,omitempty"`
	// CheckpointEnabled and RestoreEnabled say whether the runtime's
	// configuration lets it checkpoint and restore containers (nil: not
	// known). Setting is the exact setting that turns them on, and
	// ConfigPath the file(s) the agent read it from.
	CheckpointEnabled *bool  `json:"checkpointEnabled,omitempty"`
	RestoreEnabled    *bool  `json:"restoreEnabled,omitempty"`
	Setting           string `json:"setting,omitempty"`
	ConfigPath        string `json:"configPath,omitempty"`
	// CgroupVersion is 1 or 2 (0: not known).
	CgroupVersion int `json:"cgroupVersion,omitempty"`
	// Notes are what the agent could not find out, and why.
	Notes []string `json:"notes,omitempty"`
}
