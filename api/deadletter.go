package api

import "time"

// DeadLetter is one message of DEAD; ID is its sequence there.
type DeadLetter struct {
	ID         uint64              `json:"id"`
	Time       time.Time           `json:"time"`
	Subject    string              `json:"subject"` // the original subject
	Consumer   string              `json:"consumer"`
	Reason     string              `json:"reason"`
	Deliveries int                 `json:"deliveries"`
	EventID    string              `json:"event_id"`
	Headers    map[string][]string `json:"headers"`
	Body       []byte              `json:"body"`
}
