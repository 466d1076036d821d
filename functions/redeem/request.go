package redeem

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/mops/coupon-api/shared/redemption"
	"github.com/mops/coupon-api/shared/reqbody"
)

// MaxBodyBytes is the largest request body accepted, in bytes (docs/api.md: 4 KiB, as
// IssueCoupon's).
const MaxBodyBytes = 4 << 10

// decodeRequest judges the request by IssueCoupon's body rules, in their order, and returns the
// HTTP status of the first failure: the method (405), the headers (415: a Content-Type other
// than application/json, a Content-Encoding other than identity), the size (413, the whole body
// read up to [MaxBodyBytes] first), then the content (400): one JSON object with the string
// fields action, coupon_id, member_id, order_id and, for a rollback only, reason, each once,
// nothing after it, each of the contract's format ([redemption.Request.Check]). The answers
// decided by the headers close the connection without reading the body (reqbody.SkipBody).
func decodeRequest(w http.ResponseWriter, r *http.Request) (redemption.Request, int, error) {
	var req redemption.Request
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		reqbody.SkipBody(w, r)
		return req, http.StatusMethodNotAllowed, fmt.Errorf("method %s: use POST", r.Method)
	}
	if !reqbody.IsJSON(r.Header) {
		reqbody.SkipBody(w, r)
		return req, http.StatusUnsupportedMediaType, reqbody.ErrNotJSONType
	}
	if enc := reqbody.Encoding(r.Header); enc != "" {
		reqbody.SkipBody(w, r)
		return req, http.StatusUnsupportedMediaType, fmt.Errorf("Content-Encoding %q: send the body uncompressed", enc)
	}
	body, status, err := reqbody.Read(w, r, MaxBodyBytes)
	if err != nil {
		return req, status, err
	}
	if err := decodeObject(body, &req); err != nil {
		return req, http.StatusBadRequest, err
	}
	if err := req.Check(); err != nil {
		return req, http.StatusBadRequest, err
	}
	return req, 0, nil
}

// decodeObject reads {"action": "...", "coupon_id": "...", "member_id": "...", "order_id": "...",
// "reason": "..."} by the shared rules (reqbody.DecodeObject): strings, each once, nothing else;
// every field but reason required.
func decodeObject(body []byte, req *redemption.Request) error {
	seen := map[string]bool{}
	str := func(name string, dst *string) func(reqbody.Value) error {
		return func(v reqbody.Value) (err error) {
			seen[name] = true
			*dst, err = v.String()
			return err
		}
	}
	var action string
	err := reqbody.DecodeObject(body, reqbody.Fields{
		"action":    str("action", &action),
		"coupon_id": str("coupon_id", &req.CouponID),
		"member_id": str("member_id", &req.MemberID),
		"order_id":  str("order_id", &req.OrderID),
		"reason":    str("reason", &req.Reason),
	})
	req.Action = redemption.Action(action)
	switch {
	case errors.Is(err, reqbody.ErrEmpty):
		return errors.New(`body is empty: want {"action": "redeem", "coupon_id": "...", "member_id": "...", "order_id": "..."}`)
	case err != nil:
		return err
	}
	for _, name := range []string{"action", "coupon_id", "member_id", "order_id"} {
		if !seen[name] {
			return fmt.Errorf("missing field %q", name)
		}
	}
	if req.Action == redemption.Rollback && !seen["reason"] {
		return errors.New(`missing field "reason": a rollback names why`)
	}
	return nil
}
