// Package formats is meshnode's version (MeshnodeVersion), and lists the persistent formats and the wire protocol this meshnode binary
// writes, and the oldest version of each it still reads: what `meshnode version` reports and
// what an operator compares before mixing versions in one mesh (docs/operations.md,
// Upgrades). A format that had a version marker before this list (the snapshot's
// format_version, the audit record's leading byte) is read from where it is defined; the
// others had none, and their version 1 is the format as it was when this list was made.
package formats
