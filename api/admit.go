package api

import (
	"fmt"
	"strconv"
	"strings"
)

// What the node's admitter (DESIGN §14) answers a publish it does not pass on to a stream.
// The answer has JetStream's own error shape, {"error":{"code":…,"err_code":…,"description":…}},
// so a client of any language that publishes with a JetStream library sees a refusal where it
// waits for a PubAck; nats.go returns it as a *jetstream.APIError with ErrorCode set.
const (
	// AdmitOverQuota is final: the module holds its quota of EVENTS. Its description names the
	// module, its use and its quota.
	AdmitOverQuota = 19001
	// AdmitAuditBehind is retryable: the audit log of a live member is too far behind to take
	// more (back-pressure, never loss). The sdk retries with back-off.
	AdmitAuditBehind = 19002
	// AdmitOverRate is retryable: the module sends faster than its pace on this node. Its
	// description names the pace (OverRateDescription), and the sdk sends at it.
	AdmitOverRate = 19003
	// AdmitNotAdmitted is final: the subject is not one the admitter passes on (not an event
	// or a seat's job of the module under whose prefix it came).
	AdmitNotAdmitted = 19004
	// AdmitCutOff is final for this attempt: the module is on a site whose link to the mesh is
	// down, and a seat's job is queued on the mesh's servers. The description says so; the
	// module may submit it again once the link is back.
	AdmitCutOff = 19005
)

// OverRateDescription is an AdmitOverRate refusal's description: it names the module's pace,
// perSecond events and jobs a second, in words a client can read back (OverRatePace).
func OverRateDescription(module string, perSecond float64) string {
	return fmt.Sprintf("module %s sends faster than %s%g a second on this node (emit-rate); retry later", module, pacePhrase, perSecond)
}

// pacePhrase precedes the pace in OverRateDescription.
const pacePhrase = "its pace of "

// OverRatePace reads the pace out of an AdmitOverRate refusal's description; ok is false if
// it names none (another refusal, or an admitter that words it otherwise).
func OverRatePace(description string) (perSecond float64, ok bool) {
	_, rest, found := strings.Cut(description, pacePhrase)
	if !found {
		return 0, false
	}
	number, _, _ := strings.Cut(rest, " ")
	v, err := strconv.ParseFloat(number, 64)
	return v, err == nil && v > 0
}

// AdmitRetryable reports whether a refusal with err_code code may succeed if sent again later.
func AdmitRetryable(code int) bool { return code == AdmitAuditBehind || code == AdmitOverRate }

// AdmitRefusal is the admitter's answer to a publish it refuses.
type AdmitRefusal struct {
	Error AdmitError `json:"error"`
}

// AdmitError is JetStream's API error shape.
type AdmitError struct {
	Code        int    `json:"code"`     // an HTTP-like status: 429 retryable, 403 final
	ErrCode     int    `json:"err_code"` // one of the Admit* codes
	Description string `json:"description"`
}

// NewAdmitRefusal is the refusal with err_code code and description.
func NewAdmitRefusal(code int, description string) AdmitRefusal {
	status := 403
	if AdmitRetryable(code) {
		status = 429
	}
	return AdmitRefusal{Error: AdmitError{Code: status, ErrCode: code, Description: description}}
}

// QuotaUse is one module's use of EVENTS against its quota on the node that answers:
// `module ls`, the console and the metrics show it.
type QuotaUse struct {
	Module string `json:"module"`
	// Held is what the node's audit log has recorded of the module's events (its seats'
	// included) still younger than EVENTS' max age, in bytes.
	Held int64 `json:"held"`
	// Pending is what this node admitted that its audit log has not recorded yet, in bytes.
	Pending int64 `json:"pending"`
	// Limit is module-events-max-bytes; 0: no quota.
	Limit int64 `json:"limit"`
	// Refused counts this node's refusals of the module since it started, by reason (every
	// reason of package admit's, zero until refused).
	Refused map[string]uint64 `json:"refused,omitempty"`
}

// Refusals is how many times the node refused the module since it started, every reason.
func (u QuotaUse) Refusals() uint64 {
	var n uint64
	for _, c := range u.Refused {
		n += c
	}
	return n
}

// Idle reports whether the module holds nothing in EVENTS and was never refused: the metrics
// and the console leave such a module out (at 10,000 modules, most of them).
func (u QuotaUse) Idle() bool { return u.Held+u.Pending == 0 && u.Refusals() == 0 }
