// Package existencegate is the Go client of existence-gate: the gate's calls with coalescing of
// single-key lookups (GateClient), the recommended read path over a source of truth (GatedReader), and a
// mirror of a namespace's filter that answers ABSENT with no call while it holds a sub-lease (Mirror).
//
//	client, err := existencegate.NewGateClient([]string{"10.0.0.1:50051", "10.0.0.2:50051"}, "users")
//	if err != nil { ... }
//	defer client.Close()
//	reader := existencegate.NewGatedReader(client, db.LoadUser) // func(ctx, key) (User, Status, error)
//	defer reader.Close()
//	user, found, err := reader.Get(ctx, "user:42")
//
// The behaviour, defaults and counters are those of every existence-gate client library (clients/README.md
// in the repository). Errors of the gate's calls are gRPC status errors, unchanged: status.Code(err) tells
// INVALID_ARGUMENT from UNAVAILABLE.
//
// The generated stubs live in the existencepb package; they are regenerated from proto/ by go generate (and
// checked against the committed ones by test.sh).
package existencegate

//go:generate protoc -I ../../proto --go_out=. --go_opt=module=github.com/existence-gate/existence-gate/clients/go "--go_opt=Mexistence/v1/existence.proto=github.com/existence-gate/existence-gate/clients/go/existencepb;existencepb" --go-grpc_out=. --go-grpc_opt=module=github.com/existence-gate/existence-gate/clients/go "--go-grpc_opt=Mexistence/v1/existence.proto=github.com/existence-gate/existence-gate/clients/go/existencepb;existencepb" existence/v1/existence.proto
