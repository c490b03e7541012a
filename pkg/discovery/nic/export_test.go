package nic

import "github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"

// Fixture is fixture, for the tests of package nic_test.
var Fixture = fixture

// WellKnown is the type of a well-known attribute. The contract lives in
// pkg/devicekind/kinds, which imports this package: contract_test.go hands
// it in before any test runs.
var WellKnown func(name string) v1alpha1.AttributeType
