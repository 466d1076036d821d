package issue

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/mops/coupon-api/shared/ids"
	"github.com/mops/coupon-api/shared/reqbody"
)

// MaxBodyBytes is the largest request body accepted, in bytes (docs/api.md: 4 KiB).
const MaxBodyBytes = 4 << 10

// request is the body of IssueCoupon.
type request struct {
	MemberID   string
	CampaignID string
	// DryRun asks what the member would get now, writing nothing (docs/api.md, "Dry run").
	DryRun bool
}

// decodeRequest judges the request in this order, and returns the HTTP status of the first
// failure: the method (405), the headers (415: a Content-Type other than application/json, a
// Content-Encoding other than identity, since a compressed body is not JSON until inflated),
// the size (413: the whole body is read up to [MaxBodyBytes] before any of it is parsed, so an
// oversized body is 413 whatever it holds, docs/api.md), then the content (400): one JSON object
// with the string fields member_id and campaign_id and, optionally, the boolean dry_run, each
// once, nothing after it, and ids of the contract's formats. The answers decided by the headers (405, 415, 413 by
// Content-Length) close the connection without reading the body (reqbody.SkipBody).
func decodeRequest(w http.ResponseWriter, r *http.Request) (request, int, error) {
	var req request
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
	if err := ids.Request(req.MemberID, req.CampaignID); err != nil {
		return req, http.StatusBadRequest, err
	}
	return req, 0, nil
}

// decodeObject reads {"member_id": "...", "campaign_id": "...", "dry_run": true} by the shared
// rules (reqbody.DecodeObject): both ids required, strings, dry_run optional, a boolean, each
// once, nothing else.
func decodeObject(body []byte, req *request) error {
	var member, campaign bool
	err := reqbody.DecodeObject(body, reqbody.Fields{
		"member_id": func(v reqbody.Value) (err error) {
			member = true
			req.MemberID, err = v.String()
			return err
		},
		"campaign_id": func(v reqbody.Value) (err error) {
			campaign = true
			req.CampaignID, err = v.String()
			return err
		},
		"dry_run": func(v reqbody.Value) (err error) {
			req.DryRun, err = v.Bool()
			return err
		},
	})
	switch {
	case errors.Is(err, reqbody.ErrEmpty):
		return errors.New(`body is empty: want {"member_id": "...", "campaign_id": "..."}`)
	case err != nil:
		return err
	case !member:
		return errors.New(`missing field "member_id"`)
	case !campaign:
		return errors.New(`missing field "campaign_id"`)
	}
	return nil
}
