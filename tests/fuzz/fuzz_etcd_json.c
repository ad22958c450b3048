/*
 * fuzz_etcd_json.c — libFuzzer harness of the etcd gateway's answers
 * (engine_etcd/etcd_json.c), fed the way the engine feeds them.
 *
 * One input is one HTTP body (or one line of a watch stream). It goes
 * through every reader the engine has: the error body of a failed call
 * (cerb__etcd_parse_error, on raw bytes), a watch-stream line
 * (cerb__etcd_parse_watch_line), and, when it is a JSON object, what
 * etcd_http.c's read_answer does (in-band error, unwrap "result") followed
 * by each response parser: range, txn with 0/1/2 expected responses and
 * each response's range, keepalive, header revision. The body's bytes are
 * also base64-encoded and decoded, which must give them back.
 *
 * Properties: no crash, no undefined behaviour, no leak; a parser that
 * answers CERB_OK gives results of the documented shape (a range with kvs
 * has a decoded key; an error body's message is terminated); a failure is
 * CERB_EPROTO (or CERB_ENOMEM) with a message; base64 round-trips.
 */
#include "internal_posix.h"

#include "alloc.h"
#include "etcd_json.h"
#include "fuzz.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    return 0;
}

static void check_failure(cerb_status st, const char *what)
{
    FUZZ_CHECK(st == CERB_EPROTO || st == CERB_ENOMEM, "%s: status %s", what,
               cerb_status_name(st));
    FUZZ_CHECK(cerb_last_error()[0] != '\0', "%s: a failure without a message", what);
}

static void range(const json_t *rr)
{
    struct etcd_range_res res;
    cerb_status st = cerb__etcd_parse_range(rr, &res);
    if (st == CERB_OK) {
        if (res.n_kvs > 0) {
            FUZZ_CHECK(res.first.key != NULL, "a kv without its decoded key");
            FUZZ_CHECK(res.first.key[res.first.key_len] == '\0', "decoded key not terminated");
        }
        cerb__etcd_kv_clear(&res.first);
    } else {
        FUZZ_CHECK(res.n_kvs == 0 && res.first.key == NULL, "a failed range kept a kv");
        check_failure(st, "range");
    }
}

static void txn(const json_t *resp, size_t want)
{
    bool ok = false;
    int64_t rev = 0;
    const json_t *responses = NULL;
    cerb_status st = cerb__etcd_parse_txn(resp, want, &ok, &rev, &responses);
    if (st != CERB_OK) {
        check_failure(st, "txn");
        return;
    }
    size_t n = json_array_size(responses);
    FUZZ_CHECK(want == 0 || n == want, "txn: %zu responses, wanted %zu", n, want);
    for (size_t i = 0; i <= n; i++) {
        const json_t *rr = cerb__etcd_txn_range(responses, i);
        if (rr)
            range(rr);
    }
}

static void answer(json_t *root)
{
    struct etcd_error_body eb;
    int64_t v1, v2;

    if (cerb__etcd_error_of(root, &eb)) {
        FUZZ_CHECK(memchr(eb.message, '\0', sizeof eb.message), "error message not terminated");
        return;
    }
    /* read_answer(): a stream's answer is wrapped in "result". */
    json_t *r = json_object_get(root, "result");
    const json_t *body = json_is_object(r) ? r : root;
    range(body);
    for (size_t want = 0; want <= 2; want++)
        txn(body, want);
    cerb_status st = cerb__etcd_parse_keepalive(body, &v1, &v2);
    if (st != CERB_OK)
        check_failure(st, "keepalive");
    st = cerb__etcd_header_rev(body, &v1);
    if (st != CERB_OK)
        check_failure(st, "header");
}

static void base64(const uint8_t *data, size_t size)
{
    char *enc = cerb__etcd_b64_encode(data, size);
    char *dec = NULL;
    size_t n = 0;

    FUZZ_CHECK(enc != NULL, "base64 encode failed");
    FUZZ_CHECK(cerb__etcd_b64_decode(enc, &dec, &n) == CERB_OK, "decode of our own encoding: %s",
               cerb_last_error());
    FUZZ_CHECK(n == size && (size == 0 || memcmp(dec, data, size) == 0),
               "base64 did not round-trip (%zu bytes in, %zu out)", size, n);
    cerb__free(enc);
    cerb__free(dec);
    /* The input itself as base64 text, as a key from the server. */
    char *s = fuzz_cstr(data, size);
    if (cerb__etcd_b64_decode(s, &dec, &n) == CERB_OK) {
        FUZZ_CHECK(dec != NULL && dec[n] == '\0', "decoded text not terminated");
        cerb__free(dec);
    }
    free(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct etcd_error_body eb;
    struct etcd_watch_msg m;

    cerb__etcd_parse_error((const char *)data, size, &eb);
    FUZZ_CHECK(memchr(eb.message, '\0', sizeof eb.message), "error message not terminated");

    cerb_status st = cerb__etcd_parse_watch_line((const char *)data, size, &m);
    if (st == CERB_OK)
        FUZZ_CHECK(m.n_delete <= m.n_events, "more DELETE events than events");
    else
        check_failure(st, "watch line");

    json_error_t jerr;
    json_t *root = size ? json_loadb((const char *)data, size, 0, &jerr) : NULL;
    if (json_is_object(root))
        answer(root);
    json_decref(root);

    base64(data, size);
    return 0;
}
