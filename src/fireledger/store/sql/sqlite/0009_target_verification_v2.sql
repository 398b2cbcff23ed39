-- Ownership challenge v2 (issue 13, decisions 0088-0089). The challenge now expects a key
-- authorisation (token "." HMAC under a deployment key) that an origin echoing the request path
-- cannot produce, and a plain-http target with a host name is pinned to the addresses that answered
-- it (space-separated, canonical text) so a name that later resolves elsewhere is not sent to.
ALTER TABLE targets ADD COLUMN verified_addresses TEXT;
-- Verifications made under the old challenge (the body was the token, which an echoing origin
-- returns) prove nothing: every such target must be verified again before it is called.
UPDATE targets SET verification_state = 'unverified', verified_us = NULL, verification_expires_us = NULL,
       verification_error = 'the ownership challenge changed (decision 0088): serve verification.response and verify again'
 WHERE kind = 'http' AND verification_state = 'verified' AND deleted_us IS NULL;
