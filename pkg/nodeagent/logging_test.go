package nodeagent

import logsapi "k8s.io/component-base/logs/api/v1"

// The tests run NewCommand many times in one process: each applies the same
// logging configuration again, which component-base refuses by default (a
// binary applies it once). Upstream's tests set the same.
func init() {
	logsapi.ReapplyHandling = logsapi.ReapplyHandlingIgnoreUnchanged
}
