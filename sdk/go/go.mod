module github.com/outbox-relay/outbox-relay/sdk/go

go 1.19

require github.com/jackc/pgx/v4 v4.15.0
