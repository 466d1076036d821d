package reqbody_test

import (
	"net/http"
	"testing"

	"github.com/mops/coupon-api/shared/reqbody"
)

func TestEncoding(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		values []string
		want   string
	}{
		{nil, ""},
		{[]string{"identity"}, ""},
		{[]string{"IDENTITY, identity"}, ""},
		{[]string{"gzip"}, "gzip"},
		{[]string{"identity, br"}, "br"},
		{[]string{"identity", "deflate"}, "deflate"},
	} {
		h := http.Header{}
		for _, v := range tc.values {
			h.Add("Content-Encoding", v)
		}
		if got := reqbody.Encoding(h); got != tc.want {
			t.Errorf("Encoding(%q) = %q, want %q", tc.values, got, tc.want)
		}
	}
}
