package issue

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"

	"github.com/mops/coupon-api/shared/ids"
)

// MaxBodyBytes is the largest request body accepted, in bytes (docs/api.md: 4 KiB).
const MaxBodyBytes = 4 << 10

// request is the body of IssueCoupon.
type request struct {
	MemberID   string
	CampaignID string
}

// decodeRequest checks method, content type and size, then decodes the body strictly: one JSON
// object with exactly the string fields member_id and campaign_id, each once, nothing after it.
// On failure it returns the HTTP status to answer with (400, 405, 413 or 415).
func decodeRequest(w http.ResponseWriter, r *http.Request) (request, int, error) {
	var req request
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		return req, http.StatusMethodNotAllowed, fmt.Errorf("method %s: use POST", r.Method)
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		return req, http.StatusUnsupportedMediaType, errors.New("Content-Type must be application/json")
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	err := decodeObject(dec, &req)
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		return req, http.StatusRequestEntityTooLarge, fmt.Errorf("body over %d bytes", MaxBodyBytes)
	}
	if err == nil {
		err = ids.Request(req.MemberID, req.CampaignID)
	}
	if err != nil {
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
