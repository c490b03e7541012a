package kubectlplugin

import (
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"

	"sigs.k8s.io/yaml"
)

// print writes v as -o asks: the table by default, or v as JSON or YAML (the
// structures' json names, which stay stable for scripts).
func (o *options) print(v any, table func(w io.Writer)) error {
	out := o.streams.Out
	switch o.output {
	case "":
		tw := tabwriter.NewWriter(out, 0, 8, 2, ' ', 0)
		table(tw)
		return tw.Flush()
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
