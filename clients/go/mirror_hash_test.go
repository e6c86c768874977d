package existencegate

import (
	"bufio"
	"encoding/hex"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The gate's hash values (clients/testdata/filter-hash.txt, kept equal to the gate's by
// crates/core/src/hashing.rs) for keys of every length foldhash treats apart: a copy whose hash differs
// anywhere sets and reads other bits than the gate's, and would answer ABSENT for keys the gate holds.
func TestFilterHashIsTheGates(t *testing.T) {
	path := filepath.Join(hashVectorsDir(t), "filter-hash.txt")
	file, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	checked := 0
	lines := bufio.NewScanner(file)
	for lines.Scan() {
		line := lines.Text()
		if strings.HasPrefix(line, "#") || line == "" {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) != 3 {
			t.Fatalf("malformed line %q", line)
		}
		seed, err1 := strconv.ParseUint(fields[0], 16, 64)
		want, err2 := strconv.ParseUint(fields[2], 10, 64)
		key, err3 := []byte(nil), error(nil)
		if fields[1] != "-" {
			key, err3 = hex.DecodeString(fields[1])
		}
		if err1 != nil || err2 != nil || err3 != nil {
			t.Fatalf("malformed line %q", line)
		}
		if got := newFilterHasher(seed).hash(string(key)); got != want {
			t.Errorf("seed %016x, key of %d bytes: %d, the gate's is %d", seed, len(key), got, want)
		}
		checked++
	}
	if err := lines.Err(); err != nil {
		t.Fatal(err)
	}
	if checked < 200 {
		t.Fatalf("only %d vectors in %s", checked, path)
	}
}

// hashVectorsDir is clients/testdata: beside this module in the repository, or named by
// EXISTENCE_GATE_CONFORMANCE's parent when the tests run in a copy (test.sh).
func hashVectorsDir(t *testing.T) string {
	if conformance := os.Getenv("EXISTENCE_GATE_CONFORMANCE"); conformance != "" {
		return filepath.Join(filepath.Dir(conformance), "testdata")
	}
	return filepath.Join("..", "testdata")
}
