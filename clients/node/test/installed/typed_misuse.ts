// Misuses that tsc must report against the installed package's declarations (clients/node/test.sh expects
// exactly these two errors): an unknown option, and a lookup's answer used as a string.
import { GateClient } from 'existence-gate-client';

const client = new GateClient('gate:50051', { namespce: 'users' }); // error TS2561 (unknown option)

async function wrong(): Promise<string> {
  return (await client.mayExist('user:1')).observedSeq; // error TS2322 (a number)
}
export { wrong };
