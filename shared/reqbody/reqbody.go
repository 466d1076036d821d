// Package reqbody holds the request-body rules both functions share (docs/api.md): a body is
// sent as is, never compressed, so a Content-Encoding other than identity is refused with 415
// before the body is read.
package reqbody

import (
	"net/http"
	"strings"
)

// Encoding returns the first Content-Encoding coding of h other than identity, or "" when the
// body is sent as is (RFC 9110, 8.4 "Content-Encoding").
func Encoding(h http.Header) string {
	for _, v := range h.Values("Content-Encoding") {
		for coding := range strings.SplitSeq(v, ",") {
			if c := strings.TrimSpace(coding); c != "" && !strings.EqualFold(c, "identity") {
				return c
			}
		}
	}
	return ""
}
