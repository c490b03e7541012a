package selector

import (
	"fmt"
	"strconv"
	"strings"
)

// parseBool accepts only "true" and "false", in any case: "1" or "yes" would be a
// guess.
func parseBool(s string) (bool, error) {
	switch {
	case strings.EqualFold(s, "true"):
		return true, nil
	case strings.EqualFold(s, "false"):
		return false, nil
	}
	return false, fmt.Errorf("%q is not a boolean (write true or false)", s)
}

func parseInt(s string) (int64, error) {
	i, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%q is not an integer", s)
	}
	return i, nil
}
