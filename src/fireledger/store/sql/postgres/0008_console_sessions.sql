-- Console sessions (issue 13, decision 0084): the console's cookie holds a random session id, never
-- a bearer token. Only the id's SHA-256 is stored (a database reader cannot sign in with it). A
-- session is live while it has not expired and its principal is neither revoked nor of a deleted
-- tenant (checked by a join on every page), so revoking the principal or deleting the tenant ends
-- it at once in every control process; signing out deletes the row. tenant_id lets the tenant purge
-- delete the rows with the rest of the tenant.
CREATE TABLE console_sessions (
  id_hash TEXT PRIMARY KEY,
  tenant_id TEXT NOT NULL REFERENCES tenants(id),
  principal_id TEXT NOT NULL REFERENCES principals(id),
  created_us BIGINT NOT NULL,
  expires_us BIGINT NOT NULL
);
CREATE INDEX console_sessions_by_principal ON console_sessions (principal_id, created_us);
CREATE INDEX console_sessions_by_expiry ON console_sessions (expires_us);
