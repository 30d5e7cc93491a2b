// Pinned FerretDB v1 (SQLite backend for local dev), built by
// scripts/ensure-tools.sh into .tools/bin/ferretdb.
//
// Do NOT build it with a plain `go build`/`go tool`/`go install ...@v1.24.2`:
// the binary panics at start ("Invalid build/version/version.txt file
// content"). FerretDB's build/version package embeds *.txt and, when the
// binary's buildinfo main module is github.com/FerretDB/FerretDB (which is
// the case for `go install` AND for a tool built from this module, because Go
// records the main package's module there), it requires version.txt, which is
// generated in FerretDB's own repo and is not in the module zip. No build tag
// or -ldflags -X can set it (it is a struct field filled from go:embed), and
// -overlay may not touch files under GOMODCACHE. ensure-tools.sh therefore
// copies the checksum-verified module source to .tools/build/, writes
// build/version/version.txt there, and builds via a `replace` to that copy.
// Bump with: go get -tool github.com/FerretDB/FerretDB/cmd/ferretdb@vX.Y.Z && go mod tidy
//
// modernc.org/sqlite (FerretDB's SQLite driver) is pinned above the v1.32.0 that
// FerretDB 1.24.2 names. When a command's context ended (maxTimeMS), that driver could
// drop a query right after its first row without closing it: the statement stayed open
// on its pooled connection, which then read from an old snapshot (rows written later
// were missing) and held back WAL checkpoints; and its interrupt could land late, in
// another statement. Fixed upstream in v1.40.1 and v1.42.2. v1.46.2 also rolls back a
// connection whose COMMIT failed (v1.46.1), which our one writer connection
// (write-queue.patch) needs, and brings SQLite 3.51.3, which fixes SQLite's WAL-reset
// corruption bug (3.7.0-3.51.2; two connections writing or checkpointing at once). It
// needs go 1.25, as natscli does. Upstream asks for exactly the modernc.org/libc its
// go.mod names (v1.70.0 here): bump the two together, never libc alone.
// See deploy/tools/README.md.

module runs/deploy/tools/ferretdb

go 1.25.0

tool github.com/FerretDB/FerretDB/cmd/ferretdb

require (
	filippo.io/edwards25519 v1.1.0 // indirect
	github.com/AlekSi/pointer v1.2.0 // indirect
	github.com/FerretDB/FerretDB v1.24.2 // indirect
	github.com/FerretDB/wire v0.0.8 // indirect
	github.com/SAP/go-hdb v1.13.6 // indirect
	github.com/alecthomas/kong v0.9.0 // indirect
	github.com/arl/statsviz v0.6.0 // indirect
	github.com/beorn7/perks v1.0.1 // indirect
	github.com/cenkalti/backoff/v5 v5.0.2 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/dustin/go-humanize v1.0.1 // indirect
	github.com/go-logr/logr v1.4.2 // indirect
	github.com/go-logr/stdr v1.2.2 // indirect
	github.com/go-sql-driver/mysql v1.9.2 // indirect
	github.com/golang/snappy v0.0.4 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/gorilla/websocket v1.5.0 // indirect
	github.com/grpc-ecosystem/grpc-gateway/v2 v2.26.3 // indirect
	github.com/jackc/pgerrcode v0.0.0-20240316143900-6e2875d9b438 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/pgx/v5 v5.7.5 // indirect
	github.com/jackc/puddle/v2 v2.2.2 // indirect
	github.com/klauspost/compress v1.18.0 // indirect
	github.com/mattn/go-isatty v0.0.20 // indirect
	github.com/montanaflynn/stats v0.7.1 // indirect
	github.com/munnerz/goautoneg v0.0.0-20191010083416-a7dc8b61c822 // indirect
	github.com/ncruces/go-strftime v1.0.0 // indirect
	github.com/pmezard/go-difflib v1.0.0 // indirect
	github.com/prometheus/client_golang v1.22.0 // indirect
	github.com/prometheus/client_model v0.6.2 // indirect
	github.com/prometheus/common v0.64.0 // indirect
	github.com/prometheus/procfs v0.15.1 // indirect
	github.com/remyoudompheng/bigfft v0.0.0-20230129092748-24d4a6f8daec // indirect
	github.com/xdg-go/pbkdf2 v1.0.0 // indirect
	github.com/xdg-go/scram v1.1.2 // indirect
	github.com/xdg-go/stringprep v1.0.4 // indirect
	github.com/youmark/pkcs8 v0.0.0-20240726163527-a2c0da244d78 // indirect
	go.mongodb.org/mongo-driver v1.17.3 // indirect
	go.opentelemetry.io/auto/sdk v1.1.0 // indirect
	go.opentelemetry.io/otel v1.36.0 // indirect
	go.opentelemetry.io/otel/exporters/otlp/otlptrace v1.36.0 // indirect
	go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp v1.36.0 // indirect
	go.opentelemetry.io/otel/metric v1.36.0 // indirect
	go.opentelemetry.io/otel/sdk v1.36.0 // indirect
	go.opentelemetry.io/otel/trace v1.36.0 // indirect
	go.opentelemetry.io/proto/otlp v1.6.0 // indirect
	go.uber.org/automaxprocs v1.6.0 // indirect
	golang.org/x/crypto v0.38.0 // indirect
	golang.org/x/crypto/x509roots/fallback v0.0.0-20250515174705-ebc8e4631531 // indirect
	golang.org/x/exp v0.0.0-20251023183803-a4bb9ffd2546 // indirect
	golang.org/x/net v0.40.0 // indirect
	golang.org/x/sync v0.19.0 // indirect
	golang.org/x/sys v0.42.0 // indirect
	golang.org/x/text v0.25.0 // indirect
	google.golang.org/genproto/googleapis/api v0.0.0-20250519155744-55703ea1f237 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20250519155744-55703ea1f237 // indirect
	google.golang.org/grpc v1.72.1 // indirect
	google.golang.org/protobuf v1.36.6 // indirect
	modernc.org/libc v1.70.0 // indirect
	modernc.org/mathutil v1.7.1 // indirect
	modernc.org/memory v1.11.0 // indirect
	modernc.org/sqlite v1.46.2 // indirect
)
