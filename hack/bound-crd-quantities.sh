#!/usr/bin/env bash
# Narrows the schema of every quantity in the generated CRDs. controller-gen
# writes apimachinery's pattern for resource.Quantity, which takes any
# exponent and any length, and apimachinery's parser costs 10^|exponent| on
# some of them ("1e-999999999" never returns). The bounds are pkg/selector's
# (docs/resource-classes.md, "Bounds"): at most 64 characters and an exponent
# within e-18 and e18; the magnitude (at most 4Ei) is left to the scheduler,
# since a pattern cannot say it. controller-gen cannot put either on a
# resource.Quantity field itself (its markers need a string type).
#
#   hack/bound-crd-quantities.sh deploy/crds/*.yaml
set -euo pipefail
upstream='^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$'
bounded='^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)(([KMGTPE]i)|[numkMGTPE]|[eE][+-]?([0-9]|1[0-8]))?$'
for f in "$@"; do
  # Literal replacement of the whole line, its indentation kept.
  UPSTREAM="$upstream" BOUNDED="$bounded" perl -0pi -e '
    my ($u, $b) = ($ENV{UPSTREAM}, $ENV{BOUNDED});
    s/^( *)pattern: \Q$u\E$/$1maxLength: 64\n$1pattern: $b/mg;
  ' "$f"
done
