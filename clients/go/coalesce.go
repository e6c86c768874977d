package existencegate

import (
	"context"
	"time"
)

// pending is one single-key lookup waiting for its batch.
type pending struct {
	key  string
	done chan result // buffered: the batch never blocks on a caller that left
}

type result struct {
	answer Answer
	err    error
}

// dispatch gathers lookups for the window after the first one (or until the batch holds maxKeys keys) and
// sends each batch from its own goroutine, so gathering the next one never waits for the gate.
func (c *GateClient) dispatch() {
	defer c.inFlight.Done()
	timer := time.NewTimer(time.Hour)
	if !timer.Stop() {
		<-timer.C
	}
	var batch []*pending
	var expired <-chan time.Time // nil while no batch is open
	send := func() {
		if expired != nil && !timer.Stop() {
			<-timer.C
		}
		expired = nil
		b := batch
		batch = nil
		c.inFlight.Add(1)
		go func() {
			defer c.inFlight.Done()
			c.sendBatch(b)
		}()
	}
	for {
		select {
		case p := <-c.queue:
			batch = append(batch, p)
			if len(batch) >= c.opts.maxKeys {
				send()
			} else if len(batch) == 1 {
				timer.Reset(c.opts.window)
				expired = timer.C
			}
		case <-expired:
			expired = nil // the timer fired and its value was received: nothing to drain
			send()
		case <-c.closed:
			if expired != nil && !timer.Stop() {
				<-timer.C
			}
			for _, p := range batch {
				p.done <- result{err: closedError()}
			}
			return
		}
	}
}

// sendBatch answers every lookup of one batch: each its own key's answer, or all the batch's error.
func (c *GateClient) sendBatch(batch []*pending) {
	keys := make([]string, len(batch))
	for i, p := range batch {
		keys[i] = p.key
	}
	c.batchedKeys.Add(uint64(len(keys)))
	answers, err := c.batch(context.Background(), keys) // bounded by the client deadline
	for i, p := range batch {
		if err != nil {
			p.done <- result{err: err}
		} else {
			p.done <- result{answer: answers[i]}
		}
	}
}
