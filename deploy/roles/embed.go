// Package roles embeds the ClusterRoles resclass aggregates into the
// cluster's view, edit and admin roles, so that the e2e harness and the demo
// grant users exactly what the install ships.
package roles

import _ "embed"

// Aggregated is aggregated.yaml: resclass-view and resclass-edit.
//
//go:embed aggregated.yaml
var Aggregated []byte
