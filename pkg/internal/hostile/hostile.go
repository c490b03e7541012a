// Package hostile builds the device attributes fuzz targets feed to the code
// that reads NodeDevices: any type, any text, and quantities of any digits and
// exponent, including those no JSON within the CRD's schema decodes to.
package hostile

import (
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
)

// Attribute is a device attribute of the type typ selects (modulo 6):
// string, int, bool, quantity (num * 10^scale), bandwidth or version (text).
func Attribute(typ uint8, text string, num int64, scale int32) v1alpha1.DeviceAttribute {
	var a v1alpha1.DeviceAttribute
	switch typ % 6 {
	case 0:
		a.StringValue = &text
	case 1:
		a.IntValue = &num
	case 2:
		b := num%2 == 0
		a.BoolValue = &b
	case 3:
		a.QuantityValue = resource.NewScaledQuantity(num, resource.Scale(scale))
	case 4:
		a.BandwidthValue = &text
	case 5:
		a.VersionValue = &text
	}
	return a
}
