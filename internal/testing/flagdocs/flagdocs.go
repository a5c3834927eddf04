// Package flagdocs checks that every flag of a command is documented in
// docs/: flags are added in code and explained in prose, and only a test
// keeps the two from drifting apart.
package flagdocs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// Check fails t for each flag of root and of its subcommands that no
// Markdown file in docsDir names as `--flag`.
func Check(t testing.TB, root *cobra.Command, docsDir string) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(docsDir, "*.md"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no Markdown files in %s: %v", docsDir, err)
	}
	var docs strings.Builder
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		docs.Write(b)
	}
	text := docs.String()
	var walk func(cmd *cobra.Command)
	walk = func(cmd *cobra.Command) {
		check := func(f *pflag.Flag) {
			if f.Name != "help" && !strings.Contains(text, "`--"+f.Name+"`") {
				t.Errorf("%s: flag --%s is documented nowhere in %s (write it as `--%s`)", cmd.CommandPath(), f.Name, docsDir, f.Name)
			}
		}
		cmd.LocalFlags().VisitAll(check)
		for _, sub := range cmd.Commands() {
			walk(sub)
		}
	}
	walk(root)
}
