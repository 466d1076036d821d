package issue

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
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
}

// decodeRequest judges the request in this order, and returns the HTTP status of the first
// failure: the method (405), the headers (415: a Content-Type other than application/json, a
// Content-Encoding other than identity, since a compressed body is not JSON until inflated),
// the size (413: the whole body is read up to [MaxBodyBytes] before any of it is parsed, so an
// oversized body is 413 whatever it holds, docs/api.md), then the content (400): one JSON object
// with exactly the string fields member_id and campaign_id, each once, nothing after it, and
// ids of the contract's formats.
func decodeRequest(w http.ResponseWriter, r *http.Request) (request, int, error) {
	var req request
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		return req, http.StatusMethodNotAllowed, fmt.Errorf("method %s: use POST", r.Method)
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		return req, http.StatusUnsupportedMediaType, errors.New("Content-Type must be application/json")
	}
	if enc := reqbody.Encoding(r.Header); enc != "" {
		return req, http.StatusUnsupportedMediaType, fmt.Errorf("Content-Encoding %q: send the body uncompressed", enc)
	}
	tooLarge := fmt.Errorf("body over %d bytes", MaxBodyBytes)
	if r.ContentLength > MaxBodyBytes {
		return req, http.StatusRequestEntityTooLarge, tooLarge
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	if errors.As(err, new(*http.MaxBytesError)) {
		return req, http.StatusRequestEntityTooLarge, tooLarge
	}
	if err != nil {
		return req, http.StatusBadRequest, fmt.Errorf("reading the body: %w", err)
	}
	if err := decodeObject(json.NewDecoder(bytes.NewReader(body)), &req); err != nil {
		return req, http.StatusBadRequest, err
	}
	if err := ids.Request(req.MemberID, req.CampaignID); err != nil {
		return req, http.StatusBadRequest, err
	}
	return req, 0, nil
}

// decodeObject walks the tokens of {"member_id": "...", "campaign_id": "..."}: encoding/json
// alone would accept duplicate keys (keeping the last) and ignore trailing data.
func decodeObject(dec *json.Decoder, req *request) error {
	if tok, err := dec.Token(); err == io.EOF {
		return errors.New(`body is empty: want {"member_id": "...", "campaign_id": "..."}`)
	} else if err != nil {
		return fmt.Errorf("body is not JSON: %w", err)
	} else if tok != json.Delim('{') {
		return errors.New("body must be a JSON object")
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return fmt.Errorf("body is not JSON: %w", err)
		}
		key := tok.(string) // inside an object, json.Decoder yields keys as strings
		var dst *string
		switch key {
		case "member_id":
			dst = &req.MemberID
		case "campaign_id":
			dst = &req.CampaignID
		default:
			return fmt.Errorf("unknown field %q", key)
		}
		if seen[key] {
			return fmt.Errorf("duplicate field %q", key)
		}
		seen[key] = true
		if tok, err = dec.Token(); err != nil {
			return fmt.Errorf("body is not JSON: %w", err)
		}
		s, ok := tok.(string)
		if !ok {
			return fmt.Errorf("field %q must be a string", key)
		}
		*dst = s
	}
	if _, err := dec.Token(); err != nil { // the closing '}'
		return fmt.Errorf("body is not JSON: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("trailing data after the JSON object")
	}
	for _, key := range []string{"member_id", "campaign_id"} {
		if !seen[key] {
			return fmt.Errorf("missing field %q", key)
		}
	}
	return nil
}
