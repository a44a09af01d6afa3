// A stock grpc-js client (no channel options: the 4 MiB default receive limit) that fetches one artifact
// from the worker's Artifacts service, for tests/interop. Prints one JSON object on stdout:
//   {"ok": true, "bytes": N, "sha256": "...", "messages": N, "max_message_bytes": N}
//   {"ok": false, "code": <grpc status number>, "status": "RESOURCE_EXHAUSTED", "details": "..."}
// Usage: node fetch_artifact.js --target HOST:PORT --artifact ID [--chunk-size N] [--token T]
//        [--protos DIR] [--tls-ca FILE --tls-cert FILE --tls-key FILE]
'use strict';

const crypto = require('crypto');
const fs = require('fs');
const path = require('path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

function parseArgs(argv) {
  const args = {chunkSize: 0, protos: path.resolve(__dirname, '../../../protos')};
  for (let i = 0; i < argv.length; i += 2) {
    const [flag, value] = [argv[i], argv[i + 1]];
    if (flag === '--help') {
      process.stdout.write('usage: node fetch_artifact.js --target HOST:PORT --artifact ID [--chunk-size N] ' +
                           '[--token T] [--protos DIR] [--tls-ca FILE --tls-cert FILE --tls-key FILE]\n');
      process.exit(0);
    }
    const key = {'--target': 'target', '--artifact': 'artifact', '--chunk-size': 'chunkSize', '--token': 'token',
                 '--protos': 'protos', '--tls-ca': 'tlsCa', '--tls-cert': 'tlsCert', '--tls-key': 'tlsKey'}[flag];
    if (!key || value === undefined) throw new Error(`unknown or incomplete argument ${flag}`);
    args[key] = key === 'chunkSize' ? Number(value) : value;
  }
  if (!args.target || !args.artifact) throw new Error('--target and --artifact are required');
  return args;
}

function credentials(args) {
  if (!args.tlsCa) return grpc.credentials.createInsecure();
  const read = (file) => (file ? fs.readFileSync(file) : null);
  return grpc.credentials.createSsl(read(args.tlsCa), read(args.tlsKey), read(args.tlsCert));
}

function main() {
  const args = parseArgs(process.argv.slice(2));
  const definition = protoLoader.loadSync('breeze_tts_proto/v1/artifacts.proto', {
    includeDirs: [args.protos], keepCase: true, longs: Number, enums: String, defaults: true,
  });
  const fetch = definition['breeze.tts.v1.Artifacts'].Fetch;
  const client = new grpc.Client(args.target, credentials(args));  // stock options: 4 MiB receive limit
  const metadata = new grpc.Metadata();
  if (args.token) metadata.set('authorization', `Bearer ${args.token}`);
  const request = {artifact_id: args.artifact, chunk_size: args.chunkSize};
  // raw messages in, so each one's size on the wire is known; decoded with the loaded type
  const call = client.makeServerStreamRequest(fetch.path, fetch.requestSerialize, (buffer) => buffer, request,
                                              metadata);
  const hash = crypto.createHash('sha256');
  let bytes = 0, messages = 0, maxMessage = 0;
  call.on('data', (buffer) => {
    messages += 1;
    maxMessage = Math.max(maxMessage, buffer.length);
    const message = fetch.responseDeserialize(buffer);
    if (message.data && message.data.length) {
      hash.update(message.data);
      bytes += message.data.length;
    }
  });
  let done = false;
  call.on('error', (err) => {
    done = true;
    const status = Object.keys(grpc.status).find((name) => grpc.status[name] === err.code);
    process.stdout.write(JSON.stringify({ok: false, code: err.code, status, details: err.details}) + '\n');
    process.exitCode = 1;
    client.close();
  });
  call.on('end', () => {
    if (done) return;
    process.stdout.write(JSON.stringify({ok: true, bytes, sha256: hash.digest('hex'), messages,
                                         max_message_bytes: maxMessage}) + '\n');
    client.close();
  });
}

main();
