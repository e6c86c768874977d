package existencegate

import (
	"container/list"
	"sync"
	"time"
)

// absenceCache is a bounded LRU of absent keys, each kept at most ttl. Not safe for concurrent use.
type absenceCache struct {
	max     int
	ttl     time.Duration
	order   *list.List // front = most recently used
	entries map[string]*list.Element
}

type absenceEntry struct {
	key     string
	expires time.Time
}

func newAbsenceCache(max int, ttl time.Duration) *absenceCache {
	return &absenceCache{max: max, ttl: ttl, order: list.New(), entries: make(map[string]*list.Element)}
}

func (c *absenceCache) contains(key string, now time.Time) bool {
	el, ok := c.entries[key]
	if !ok {
		return false
	}
	if !now.Before(el.Value.(*absenceEntry).expires) {
		c.order.Remove(el)
		delete(c.entries, key)
		return false
	}
	c.order.MoveToFront(el)
	return true
}

func (c *absenceCache) put(key string, now time.Time) {
	if el, ok := c.entries[key]; ok {
		el.Value.(*absenceEntry).expires = now.Add(c.ttl)
		c.order.MoveToFront(el)
		return
	}
	c.entries[key] = c.order.PushFront(&absenceEntry{key: key, expires: now.Add(c.ttl)})
	for c.order.Len() > c.max {
		oldest := c.order.Back()
		c.order.Remove(oldest)
		delete(c.entries, oldest.Value.(*absenceEntry).key)
	}
}

func (c *absenceCache) remove(key string) {
	if el, ok := c.entries[key]; ok {
		c.order.Remove(el)
		delete(c.entries, key)
	}
}

func (c *absenceCache) clear() {
	c.order.Init()
	c.entries = make(map[string]*list.Element)
}

// singleFlight runs one load per key at a time; concurrent callers of the same key share its result.
type singleFlight[V any] struct {
	mu    sync.Mutex
	calls map[string]*flightCall[V]
}

type flightCall[V any] struct {
	wg    sync.WaitGroup
	value V
	found bool
	err   error
}

func (g *singleFlight[V]) do(key string, fn func() (V, bool, error)) (V, bool, error) {
	g.mu.Lock()
	if g.calls == nil {
		g.calls = make(map[string]*flightCall[V])
	}
	if c, ok := g.calls[key]; ok {
		g.mu.Unlock()
		c.wg.Wait()
		return c.value, c.found, c.err
	}
	c := &flightCall[V]{}
	c.wg.Add(1)
	g.calls[key] = c
	g.mu.Unlock()

	defer func() {
		g.mu.Lock()
		delete(g.calls, key)
		g.mu.Unlock()
		c.wg.Done()
	}()
	c.value, c.found, c.err = fn()
	return c.value, c.found, c.err
}
