package outbox

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strconv"
	"time"
)

// DecodeEvent parses a CloudEvents structured-mode JSON document as written
// by the relay (and by other CloudEvents producers). It requires
// specversion 1.0 and non-empty id, source and type.
func DecodeEvent(b []byte) (Event, error) {
	var raw struct {
		SpecVersion     string          `json:"specversion"`
		ID              string          `json:"id"`
		Source          string          `json:"source"`
		Type            string          `json:"type"`
		Time            string          `json:"time"`
		DataContentType string          `json:"datacontenttype"`
		Data            json.RawMessage `json:"data"`
		DataBase64      *string         `json:"data_base64"`
		Sequence        string          `json:"sequence"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		return Event{}, fmt.Errorf("outbox: decode event: %w", err)
	}
	if raw.SpecVersion != "1.0" {
		return Event{}, fmt.Errorf("outbox: decode event: unsupported specversion %q", raw.SpecVersion)
	}
	if raw.ID == "" || raw.Source == "" || raw.Type == "" {
		return Event{}, fmt.Errorf("outbox: decode event: id, source and type are required")
	}
	ev := Event{ID: raw.ID, Source: raw.Source, Type: raw.Type, DataContentType: raw.DataContentType}
	if raw.Time != "" {
		t, err := time.Parse(time.RFC3339Nano, raw.Time)
		if err != nil {
			return Event{}, fmt.Errorf("outbox: decode event: time: %w", err)
		}
		ev.Time = t
	}
	if raw.Sequence != "" {
		n, err := strconv.ParseInt(raw.Sequence, 10, 64)
		if err != nil {
			return Event{}, fmt.Errorf("outbox: decode event: sequence: %w", err)
		}
		ev.Sequence = n
	}
	switch {
	case raw.DataBase64 != nil && raw.Data != nil:
		return Event{}, fmt.Errorf("outbox: decode event: both data and data_base64")
	case raw.DataBase64 != nil:
		d, err := base64.StdEncoding.DecodeString(*raw.DataBase64)
		if err != nil {
			return Event{}, fmt.Errorf("outbox: decode event: data_base64: %w", err)
		}
		ev.Data = d
	case len(raw.Data) > 0 && raw.Data[0] == '"' && raw.DataContentType != "" && !isJSONContentType(raw.DataContentType):
		// The CloudEvents JSON format: a string of a non-JSON content
		// type carries the data itself (an absent content type means
		// JSON, whose data is the JSON value, quotes and all).
		var text string
		if err := json.Unmarshal(raw.Data, &text); err != nil {
			return Event{}, fmt.Errorf("outbox: decode event: data: %w", err)
		}
		ev.Data = []byte(text)
	case raw.Data != nil:
		ev.Data = []byte(raw.Data)
	}
	return ev, nil
}

// DecodeEventMQTT parses an event received over MQTT, in either content
// mode of the CloudEvents MQTT binding: binary mode when the user
// properties carry specversion (the payload is the data untouched,
// contentType its datacontenttype, and the other attributes user
// properties named by the attribute), else structured mode, as DecodeEvent.
// A message over MQTT 3.1.1 has no properties: pass "" and nil. Binary
// mode's Event.Data is payload itself, not a copy. It requires specversion
// 1.0 and non-empty id, source and type in either mode; an attribute given
// twice is an error, and user properties that are not attributes the Event
// holds are ignored.
func DecodeEventMQTT(payload []byte, contentType string, user []UserProperty) (Event, error) {
	var attrs [6]*string // specversion, id, source, type, time, sequence
	for i := range user {
		k := -1
		switch user[i].Key {
		case "specversion":
			k = 0
		case "id":
			k = 1
		case "source":
			k = 2
		case "type":
			k = 3
		case "time":
			k = 4
		case "sequence":
			k = 5
		}
		if k < 0 {
			continue
		}
		if attrs[k] != nil {
			return Event{}, fmt.Errorf("outbox: decode event: attribute %q given twice", user[i].Key)
		}
		attrs[k] = &user[i].Value
	}
	if attrs[0] == nil {
		return DecodeEvent(payload)
	}
	get := func(k int) string {
		if attrs[k] == nil {
			return ""
		}
		return *attrs[k]
	}
	if v := get(0); v != "1.0" {
		return Event{}, fmt.Errorf("outbox: decode event: unsupported specversion %q", v)
	}
	ev := Event{ID: get(1), Source: get(2), Type: get(3), DataContentType: contentType, Data: payload}
	if ev.ID == "" || ev.Source == "" || ev.Type == "" {
		return Event{}, fmt.Errorf("outbox: decode event: id, source and type are required")
	}
	if v := get(4); v != "" {
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			return Event{}, fmt.Errorf("outbox: decode event: time: %w", err)
		}
		ev.Time = t
	}
	if v := get(5); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return Event{}, fmt.Errorf("outbox: decode event: sequence: %w", err)
		}
		ev.Sequence = n
	}
	return ev, nil
}
