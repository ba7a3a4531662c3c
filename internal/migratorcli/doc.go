// Package migratorcli is the migrator's command line: `migrator migrate`
// runs one migration and shows its phases live, `migrator agent` runs the
// node agent. cmd/migrator is a thin main over Main.
package migratorcli
