package outbox

import (
	"fmt"
	"net/url"
)

// parseBrokers checks a client's broker addresses, given as one (Broker) or
// several (Brokers, a cluster's nodes), and parses them in order.
func parseBrokers(what, broker string, brokers []string) ([]*url.URL, error) {
	addrs := brokers
	switch {
	case broker != "" && len(brokers) > 0:
		return nil, fmt.Errorf("outbox: %s: set Broker or Brokers, not both", what)
	case broker != "":
		addrs = []string{broker}
	case len(addrs) == 0:
		addrs = []string{""} // ParseBrokerURL says what is missing
	}
	urls := make([]*url.URL, 0, len(addrs))
	for _, a := range addrs {
		u, err := ParseBrokerURL(a)
		if err != nil {
			return nil, err
		}
		urls = append(urls, u)
	}
	return urls, nil
}

// firstBroker is the index of the address a client with this id tries
// first: FNV-1a of the id, so that a fleet starts spread over a cluster's
// nodes instead of all on the first, and one device (or consumer) always
// starts on the same node.
func firstBroker(clientID string, n int) int {
	h := uint32(2166136261)
	for i := 0; i < len(clientID); i++ {
		h = (h ^ uint32(clientID[i])) * 16777619
	}
	return int(h % uint32(n))
}
