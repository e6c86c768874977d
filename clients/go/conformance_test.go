package existencegate

// The conformance cases every client library runs (clients/conformance/cases.txt, the behaviours of
// clients/README.md written once), against a real gate started with clients/conformance/gate.toml.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// conformanceDeadline is the cases' call deadline (a loaded 2-core machine); the library's default is 500 ms.
const conformanceDeadline = 10 * time.Second

type conformanceLine struct {
	line  int
	words []string
}

type conformanceCase struct {
	number int
	name   string
	lines  []conformanceLine
}

// conformanceDir is where test.sh says the cases are (the tests run in copies of this directory).
func conformanceDir(t *testing.T) string {
	dir := os.Getenv("EXISTENCE_GATE_CONFORMANCE")
	if dir == "" {
		t.Fatal("EXISTENCE_GATE_CONFORMANCE must name clients/conformance (test.sh sets it)")
	}
	return dir
}

func readConformanceCases(t *testing.T, dir string) []conformanceCase {
	text, err := os.ReadFile(filepath.Join(dir, "cases.txt"))
	if err != nil {
		t.Fatal(err)
	}
	var cases []conformanceCase
	for i, line := range strings.Split(string(text), "\n") {
		words := strings.Fields(strings.SplitN(line, "#", 2)[0])
		switch {
		case len(words) == 0:
		case words[0] == "case":
			cases = append(cases, conformanceCase{number: len(cases) + 1, name: strings.Join(words[1:], " ")})
		default:
			last := &cases[len(cases)-1]
			last.lines = append(last.lines, conformanceLine{line: i + 1, words: words})
		}
	}
	return cases
}

// splitArrow is the words before and after "->".
func splitArrow(words []string) ([]string, []string) {
	for i, w := range words {
		if w == "->" {
			return words[:i], words[i+1:]
		}
	}
	panic("a line with ->")
}

// codeName is a status code as the cases name it (INVALID_ARGUMENT).
func codeName(c codes.Code) string {
	var name strings.Builder
	for i, r := range c.String() {
		if unicode.IsUpper(r) && i > 0 {
			name.WriteByte('_')
		}
		name.WriteRune(unicode.ToUpper(r))
	}
	return name.String()
}

// conformanceRun is a case being run: its options until the first call, then its client (and reader).
type conformanceRun struct {
	t         *testing.T
	c         conformanceCase
	gate      string
	namespace string
	options   []Option
	addresses []string
	client    *GateClient
	reader    *GatedReader[string]
	mu        sync.Mutex
	table     map[string]string
}

func (r *conformanceRun) key(word string) string {
	switch word {
	case "<empty>":
		return ""
	case "<oversized>":
		return strings.Repeat("x", 1025)
	}
	return fmt.Sprintf("%d:%s", r.c.number, word)
}

func (r *conformanceRun) gateClient() *GateClient {
	if r.client == nil {
		options := append([]Option{WithDeadline(conformanceDeadline)}, r.options...)
		r.client = newClient(r.t, r.addresses, r.namespace, options...)
	}
	return r.client
}

func (r *conformanceRun) stats() Stats {
	if r.reader != nil {
		return r.reader.Stats()
	}
	return r.client.Stats()
}

func (r *conformanceRun) line(ctx context.Context, words []string) error {
	rest := words[1:]
	switch words[0] {
	case "option":
		return r.option(rest[0], rest[1])
	case "add":
		keys := make([]string, len(rest))
		for i, w := range rest {
			keys[i] = r.key(w)
		}
		_, err := r.gateClient().Add(ctx, keys)
		return err
	case "lookup":
		return r.lookup(ctx, rest)
	case "many":
		return r.many(ctx, rest)
	case "stats":
		return r.checkStats(rest)
	case "reader":
		r.reader = NewGatedReader(r.gateClient(), func(_ context.Context, key string) (string, SourceStatus, error) {
			r.mu.Lock()
			defer r.mu.Unlock()
			if value, ok := r.table[key]; ok {
				return value, Found, nil
			}
			return "", Missing, nil
		})
		r.t.Cleanup(r.reader.Close)
		return nil
	case "row":
		r.mu.Lock()
		r.table[r.key(rest[0])] = rest[1]
		r.mu.Unlock()
		return nil
	case "get":
		question, answer := splitArrow(rest)
		got, err := r.get(ctx, question[0])
		if err == nil && got != answer[0] {
			err = fmt.Errorf("got %q, want %q", got, answer[0])
		}
		return err
	case "eventually":
		return r.eventually(ctx, rest)
	}
	return fmt.Errorf("no such line: %s", words[0])
}

func (r *conformanceRun) option(name, value string) error {
	if r.client != nil {
		return fmt.Errorf("options come before the first call")
	}
	switch name {
	case "coalesce_window_ms":
		ms, err := strconv.Atoi(value)
		r.options = append(r.options, WithCoalesceWindow(time.Duration(ms)*time.Millisecond))
		return err
	case "deadline_ms":
		ms, err := strconv.Atoi(value)
		r.options = append(r.options, WithDeadline(time.Duration(ms)*time.Millisecond))
		return err
	case "namespace":
		r.namespace = value
	case "address_policy":
		policy := map[string]AddressPolicy{"round_robin": RoundRobin, "pick_first": PickFirst}
		p, ok := policy[value]
		if !ok {
			return fmt.Errorf("no address policy %s", value)
		}
		r.options = append(r.options, WithAddressPolicy(p))
	case "addresses":
		r.addresses = nil
		for _, a := range strings.Split(value, ",") {
			switch a {
			case "gate":
				r.addresses = append(r.addresses, r.gate)
			case "dead":
				r.addresses = append(r.addresses, deadAddress(r.t))
			default:
				return fmt.Errorf("no address %s", a)
			}
		}
	default:
		return fmt.Errorf("no option %s", name)
	}
	return nil
}

func (r *conformanceRun) lookup(ctx context.Context, words []string) error {
	keys, expected := splitArrow(words)
	client := r.gateClient()
	answers := make([]string, len(keys))
	var wg sync.WaitGroup
	for i, k := range keys {
		wg.Add(1)
		go func(i int, key string) {
			defer wg.Done()
			answer, err := client.MayExist(ctx, key)
			if err != nil {
				answers[i] = codeName(status.Code(err))
			} else {
				answers[i] = strconv.FormatBool(answer.MayExist)
			}
		}(i, r.key(k))
	}
	wg.Wait()
	if !reflect.DeepEqual(answers, expected) {
		return fmt.Errorf("answers for %v: %v, want %v", keys, answers, expected)
	}
	return nil
}

func (r *conformanceRun) many(ctx context.Context, words []string) error {
	question, calls := splitArrow(words)
	count, err := strconv.Atoi(question[0])
	if err != nil {
		return err
	}
	names := make([]string, count)
	keys := make([]string, count)
	for i := range names {
		names[i] = fmt.Sprintf("%s%d", question[1], i)
		keys[i] = r.key(names[i])
	}
	client := r.gateClient()
	before := client.Stats().GateCalls
	answers, err := client.MayExistMany(ctx, keys)
	if err != nil {
		return err
	}
	if len(answers) != count {
		return fmt.Errorf("%d answers for %d keys", len(answers), count)
	}
	for _, l := range r.c.lines {
		if l.words[0] != "add" {
			continue
		}
		for _, name := range l.words[1:] {
			for i, n := range names {
				if n == name && !answers[i].MayExist {
					return fmt.Errorf("%s was added", name)
				}
			}
		}
	}
	if sent := strconv.FormatUint(client.Stats().GateCalls-before, 10); sent != calls[0] {
		return fmt.Errorf("%s calls sent, want %s", sent, calls[0])
	}
	return nil
}

// counter is the Stats field of a counter named as in clients/README.md (gate_calls → GateCalls).
func counter(stats Stats, name string) (uint64, error) {
	var field strings.Builder
	for _, part := range strings.Split(name, "_") {
		field.WriteString(strings.ToUpper(part[:1]) + part[1:])
	}
	value := reflect.ValueOf(stats).FieldByName(field.String())
	if !value.IsValid() {
		return 0, fmt.Errorf("no counter %s", name)
	}
	return value.Uint(), nil
}

func (r *conformanceRun) checkStats(checks []string) error {
	stats := r.stats()
	for _, check := range checks {
		op := "="
		if strings.Contains(check, ">=") {
			op = ">="
		}
		parts := strings.SplitN(check, op, 2)
		actual, err := counter(stats, parts[0])
		if err != nil {
			return err
		}
		wanted, err := strconv.ParseUint(parts[1], 10, 64)
		if err != nil {
			return err
		}
		if (op == ">=" && actual < wanted) || (op == "=" && actual != wanted) {
			return fmt.Errorf("%s: %s is %d (%+v)", check, parts[0], actual, stats)
		}
	}
	return nil
}

func (r *conformanceRun) get(ctx context.Context, word string) (string, error) {
	if r.reader == nil {
		return "", fmt.Errorf("a `reader` line first")
	}
	value, found, err := r.reader.Get(ctx, r.key(word))
	if err != nil || !found {
		return "missing", err
	}
	return value, nil
}

func (r *conformanceRun) eventually(ctx context.Context, words []string) error {
	deadline := time.Now().Add(patience)
	for {
		var holds bool
		switch words[0] {
		case "get":
			question, answer := splitArrow(words[1:])
			got, err := r.get(ctx, question[0])
			if err != nil {
				return err
			}
			holds = got == answer[0]
		case "cached":
			hits := r.reader.Stats().CacheHits
			got, err := r.get(ctx, words[1])
			if err != nil || got != "missing" {
				return fmt.Errorf("get %s: %q, %v", words[1], got, err)
			}
			holds = r.reader.Stats().CacheHits > hits
		default:
			return fmt.Errorf("no such eventually: %s", words[0])
		}
		if holds {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not within %v", patience)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestConformance(t *testing.T) {
	dir := conformanceDir(t)
	config, err := os.ReadFile(filepath.Join(dir, "gate.toml"))
	if err != nil {
		t.Fatal(err)
	}
	gate, err := startGate(string(config))
	if err != nil {
		t.Fatal(err)
	}
	defer gate.stop()
	for _, c := range readConformanceCases(t, dir) {
		c := c
		t.Run(fmt.Sprintf("case %d", c.number), func(t *testing.T) {
			run := &conformanceRun{t: t, c: c, gate: gate.addr, namespace: "users",
				addresses: []string{gate.addr}, table: map[string]string{}}
			ctx := context.Background()
			for _, l := range c.lines {
				if err := run.line(ctx, l.words); err != nil {
					t.Fatalf("case %d (%s), cases.txt line %d `%s`: %v", c.number, c.name, l.line,
						strings.Join(l.words, " "), err)
				}
			}
		})
	}
}
