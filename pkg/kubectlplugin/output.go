package kubectlplugin

import (
	"encoding/json"
	"fmt"
	"text/tabwriter"

	"sigs.k8s.io/yaml"
)

// print writes v as -o asks: the table by default, or v as JSON or YAML (the
// structures' json names, which stay stable for scripts).
func (o *options) print(v any, fill func(t *table)) error {
	out := o.streams.Out
	switch o.output {
	case "":
		t := &table{w: tabwriter.NewWriter(out, 0, 8, 2, ' ', 0)}
		fill(t)
		if t.err != nil {
			return t.err
		}
		return t.w.Flush()
	case "json":
		data, err := json.MarshalIndent(v, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintln(out, string(data))
		return err
	case "yaml":
		data, err := yaml.Marshal(v)
		if err != nil {
			return err
		}
		_, err = out.Write(data)
		return err
	}
	return fmt.Errorf("--output %q: want json or yaml, or nothing for tables", o.output)
}

// checkOutput refuses an unknown -o before any request is made.
func (o *options) checkOutput() error {
	switch o.output {
	case "", "json", "yaml":
		return nil
	}
	return fmt.Errorf("--output %q: want json or yaml, or nothing for tables", o.output)
}

// table is tab-separated rows, aligned when flushed; the first write error
// is kept and the rest skipped.
type table struct {
	w   *tabwriter.Writer
	err error
}

func (t *table) row(format string, args ...any) {
	if t.err == nil {
		_, t.err = fmt.Fprintf(t.w, format+"\n", args...)
	}
}
