// Package sandbox runs a module's process, or a build, isolated on the machine (DESIGN §13).
//
// The bus enforces what a module may say and hear; this package enforces what it may touch:
//
//   - Filesystem: Landlock, with no_new_privs. A process sees the paths its Proc names (its
//     own directory read-write; its artifact, credentials and secrets read-only), the
//     system's read-only runtime (System), and nothing else; Landlock's scoping (ABI 6 and
//     later) stops it signalling, or reaching an abstract socket of, any process outside
//     its own domain — the node, another module, another instance.
//   - Users: a node that runs as root gives each module a uid and gid of its own from a
//     configured range (Users), and the process runs with no capabilities.
//   - Processes: a cgroup v2 per instance where the node has a v2 hierarchy it may write,
//     so every process the module starts (setsid, double fork) is found and ended with
//     cgroup.kill; limits (pids, memory, cpu) through v2 controllers where they are enabled,
//     else through cgroup v1's. Without a v2 cgroup the node is a child subreaper and ends
//     the orphans it inherits.
//
// Landlock restricts the process that applies it, so it cannot be applied inside the node:
// Start runs the node's own binary as a small launcher (Launcher, argv[1] = LauncherArg)
// that joins the v1 cgroups, drops to the module's user, sets no_new_privs and the Landlock
// ruleset on itself, and execs the program. Its only report to the node is a pipe that
// closes on exec: a line that says what it applied, or why it could not start.
package sandbox
