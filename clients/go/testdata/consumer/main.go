// The program of test.sh's fresh module (example.org/consumer): a module outside this repository that
// requires github.com/existence-gate/existence-gate/clients/go with a replace, imports the library and its
// stubs by that path, and calls a running gate through both.
//
//	consumer HOST:PORT    (a gate with the namespace "users", as clients/conformance/gate.toml configures)
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	existencegate "github.com/existence-gate/existence-gate/clients/go"
	"github.com/existence-gate/existence-gate/clients/go/existencepb"
	"google.golang.org/grpc"
)

func main() {
	if len(os.Args) != 2 {
		fail("usage: consumer HOST:PORT")
	}
	addr := os.Args[1]
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// The stubs, on a connection of the program's own: the gate answers, and is no longer warming.
	conn, err := grpc.DialContext(ctx, addr, grpc.WithInsecure())
	if err != nil {
		fail("dial: %v", err)
	}
	defer conn.Close()
	stub := existencepb.NewExistenceGateClient(conn)
	for {
		reply, err := stub.MayExist(ctx, &existencepb.MayExistRequest{Namespace: "users", Key: []byte("consumer:ready?")})
		if err != nil {
			fail("MayExist through existencepb: %v", err)
		}
		if reply.Basis != existencepb.Basis_BASIS_WARMING {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}

	// The library: an Add, then lookups of the added key and of one never added.
	client, err := existencegate.NewGateClient([]string{addr}, "users", existencegate.WithDeadline(5*time.Second))
	if err != nil {
		fail("NewGateClient: %v", err)
	}
	defer client.Close()
	seq, err := client.Add(ctx, []string{"consumer:added"})
	if err != nil {
		fail("Add: %v", err)
	}
	added, err := client.MayExist(ctx, "consumer:added")
	if err != nil || !added.MayExist || added.ObservedSeq < seq {
		fail("MayExist(added) = %+v, %v; want may exist at seq >= %d", added, err, seq)
	}
	never, err := client.MayExist(ctx, "consumer:never-added")
	if err != nil || never.MayExist {
		fail("MayExist(never added) = %+v, %v; want absent", never, err)
	}
	current, err := stub.CurrentSeq(ctx, &existencepb.CurrentSeqRequest{Namespace: "users"})
	if err != nil || current.Seq < seq {
		fail("CurrentSeq = %v, %v; want >= %d", current, err, seq)
	}
	fmt.Printf("consumer: Add seq %d, the added key may exist, the other is absent, CurrentSeq %d\n", seq, current.Seq)
}

func fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "consumer: "+format+"\n", args...)
	os.Exit(1)
}
