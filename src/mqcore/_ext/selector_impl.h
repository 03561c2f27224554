/* SQL92 selector programs evaluated over a record's header bytes (docs/query.md "Selectors in
   the kernel"). query/selector.py compiles a parsed selector once into a flat array of mqsel_op
   (postfix, with short-circuit jumps); search.pyx runs it per record without the GIL.

   The reference is query/selector.py's Python evaluator over Message.properties; every rule
   here mirrors one there, and tests/test_selector_kernel.py checks both agree on random
   selectors and headers:
     - a property is the LAST header whose key equals the name (bytes), whose value is not null
       and is valid UTF-8 (Python's strict decoder); "uid" is never a property; TAGS falls back
       to the property "tag" when no TAGS header qualifies;
     - text is stripped of Python's str.isspace() characters before numeric and boolean
       coercion; integers are [+-]digits (ASCII), compared exactly (past int64 by sign);
       floats follow the grammar [+-]?(digits[.digits*]|.digits)([eE][+-]?digits)?, are
       correctly rounded (at most MQSEL_DIGITS significant digits reach strtod, the rest is a
       sticky digit) and must be finite; booleans are 'true'/'false' in any ASCII case;
     - strings compare by bytes, which for valid UTF-8 is Python's code point order;
     - Kleene logic: 0 FALSE, 1 TRUE, 2 UNKNOWN.
   Every step is linear in the header bytes: no allocation, no recursion. */
#ifndef MQCORE_SELECTOR_IMPL_H
#define MQCORE_SELECTOR_IMPL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#define MQSEL_FALSE 0
#define MQSEL_TRUE 1
#define MQSEL_UNKNOWN 2

#define MQSEL_MAX_NAMES 64
#define MQSEL_DIGITS 800  /* > 767, the most significant digits a double's rounding can need */

enum {
    MQSEL_CONST = 0,   /* push arg (a Kleene value) */
    MQSEL_IS_NULL,     /* push TRUE when slot is missing */
    MQSEL_CMP_STR,     /* slot <cmp> str */
    MQSEL_CMP_INT,     /* slot <cmp> ival (the property coerced to an integer) */
    MQSEL_CMP_FLOAT,   /* slot <cmp> fval (the property coerced to a double) */
    MQSEL_CMP_BOOL,    /* slot <cmp> ival (0/1; cmp is EQ or NE) */
    MQSEL_STR_TEST,    /* slot CONTAINS/STARTSWITH/ENDSWITH str, result != neg */
    MQSEL_IN,          /* slot IN (the arg items that follow: IN_STR/IN_INT/IN_FLOAT) */
    MQSEL_IN_STR,
    MQSEL_IN_INT,
    MQSEL_IN_FLOAT,
    MQSEL_NOT,
    MQSEL_AND,         /* pop b, a; push a AND b */
    MQSEL_OR,
    MQSEL_JUMP_FALSE,  /* top is FALSE: jump to arg (the AND chain's end), keeping it */
    MQSEL_JUMP_TRUE,   /* top is TRUE: jump to arg (the OR chain's end), keeping it */
};

enum { MQSEL_EQ = 0, MQSEL_NE, MQSEL_LT, MQSEL_LE, MQSEL_GT, MQSEL_GE };
enum { MQSEL_CONTAINS = 0, MQSEL_STARTSWITH, MQSEL_ENDSWITH };

typedef struct {
    uint8_t op;
    uint8_t cmp;       /* MQSEL_EQ.. for comparisons, MQSEL_CONTAINS.. for string tests */
    uint8_t neg;       /* string tests: NOT */
    uint8_t slot;      /* the property's index in the program's names */
    int32_t arg;       /* CONST: the value; IN: item count; jumps: target index */
    int64_t ival;
    double fval;
    const unsigned char *str;  /* borrowed from bytes the Python program object keeps */
    size_t str_len;
} mqsel_op;

typedef struct {
    const mqsel_op *ops;
    int n_ops;
    int stack_depth;                       /* the most values on the stack at once */
    int n_names;
    const unsigned char *names[MQSEL_MAX_NAMES];
    size_t name_len[MQSEL_MAX_NAMES];
    uint8_t never[MQSEL_MAX_NAMES];        /* "uid": never a property */
    int tags_slot, tag_slot;               /* TAGS falls back to tag (-1: not used) */
} mqsel_program;

/* One property of one record: where its text is, and its coercions once computed. */
typedef struct {
    const unsigned char *p;
    size_t n;
    int found;
    int8_t int_state;     /* 0 not computed, 1 an integer, 2 beyond int64 (sign), -1 none */
    int8_t float_state;   /* 0 not computed, 1 a finite double, -1 none */
    int8_t bool_state;    /* 0 not computed, 1 false, 2 true, -1 none */
    int8_t sign;          /* int_state 2: the sign */
    int64_t ival;
    double fval;
} mqsel_value;

/* --- text ------------------------------------------------------------------------------- */

/* Python's strict UTF-8: no overlongs, no surrogates, nothing past U+10FFFF. */
static int mqsel_utf8_valid(const unsigned char *p, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned char c = p[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        if (c >= 0xC2 && c <= 0xDF) {
            if (i + 1 >= n || (p[i + 1] & 0xC0) != 0x80)
                return 0;
            i += 2;
        } else if (c >= 0xE0 && c <= 0xEF) {
            unsigned char lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
            if (i + 2 >= n || p[i + 1] < lo || p[i + 1] > hi || (p[i + 2] & 0xC0) != 0x80)
                return 0;
            i += 3;
        } else if (c >= 0xF0 && c <= 0xF4) {
            unsigned char lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
            if (i + 3 >= n || p[i + 1] < lo || p[i + 1] > hi || (p[i + 2] & 0xC0) != 0x80
                || (p[i + 3] & 0xC0) != 0x80)
                return 0;
            i += 4;
        } else {
            return 0;
        }
    }
    return 1;
}

/* Python's str.isspace() (Unicode White_Space plus U+001C..U+001F; tests check the set). */
static int mqsel_is_space(uint32_t c)
{
    if (c <= 0x20)
        return c == 0x20 || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F);
    if (c < 0x85)
        return 0;
    return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A)
        || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/* The code point at p (valid UTF-8, n >= 1 bytes left) and its length. */
static uint32_t mqsel_decode(const unsigned char *p, size_t *len)
{
    unsigned char c = p[0];
    if (c < 0x80) {
        *len = 1;
        return c;
    }
    if (c < 0xE0) {
        *len = 2;
        return ((uint32_t)(c & 0x1F) << 6) | (p[1] & 0x3F);
    }
    if (c < 0xF0) {
        *len = 3;
        return ((uint32_t)(c & 0x0F) << 12) | ((uint32_t)(p[1] & 0x3F) << 6) | (p[2] & 0x3F);
    }
    *len = 4;
    return ((uint32_t)(c & 0x07) << 18) | ((uint32_t)(p[1] & 0x3F) << 12)
        | ((uint32_t)(p[2] & 0x3F) << 6) | (p[3] & 0x3F);
}

/* Python's str.strip() on valid UTF-8: narrows [*p, *p + *n). */
static void mqsel_strip(const unsigned char **p, size_t *n)
{
    const unsigned char *s = *p, *e = *p + *n, *q;
    size_t len;
    while (s < e && mqsel_is_space(mqsel_decode(s, &len)))
        s += len;
    while (e > s) {
        q = e - 1;
        while (q > s && (*q & 0xC0) == 0x80)
            q--;
        if (!mqsel_is_space(mqsel_decode(q, &len)))
            break;
        e = q;
    }
    *p = s;
    *n = (size_t)(e - s);
}

static int mqsel_is_digit(unsigned char c)
{
    return c >= '0' && c <= '9';
}

/* --- coercions (selector.py _as_int, _as_float, _as_bool) ----------------------------------- */

static void mqsel_as_int(mqsel_value *v)
{
    const unsigned char *p = v->p;
    size_t n = v->n, i = 0;
    uint64_t mag = 0;
    int neg = 0, significant = 0;
    mqsel_strip(&p, &n);
    if (n > 0 && (p[0] == '+' || p[0] == '-')) {
        neg = p[0] == '-';
        i = 1;
    }
    if (i == n) {
        v->int_state = -1;
        return;
    }
    for (; i < n; i++) {
        if (!mqsel_is_digit(p[i])) {
            v->int_state = -1;
            return;
        }
        if (significant || p[i] != '0') {
            significant++;
            if (significant <= 19)
                mag = mag * 10 + (uint64_t)(p[i] - '0');
        }
    }
    /* 19 digits fit uint64; past 2^63 (or 2^63 - 1 when positive) it lies beyond every int64 */
    if (significant > 19 || mag > (uint64_t)INT64_MAX + (uint64_t)neg) {
        v->int_state = 2;
        v->sign = neg ? -1 : 1;
        return;
    }
    v->int_state = 1;
    v->ival = neg ? (int64_t)(0 - mag) : (int64_t)mag;
}

static void mqsel_as_float(mqsel_value *v)
{
    const unsigned char *p = v->p;
    size_t n = v->n, i = 0;
    char buf[MQSEL_DIGITS + 32];
    int nd = 0, sticky = 0, mantissa_digits = 0, neg = 0, exp_neg = 0;
    int64_t exp10 = 0, e = 0;
    double d;
    v->float_state = -1;
    mqsel_strip(&p, &n);
    if (i < n && (p[i] == '+' || p[i] == '-'))
        neg = p[i++] == '-';
    /* digits before the point: each significant one kept (or sticky past MQSEL_DIGITS) */
    for (; i < n && mqsel_is_digit(p[i]); i++) {
        mantissa_digits++;
        if (nd == 0 && p[i] == '0')
            continue;
        if (nd < MQSEL_DIGITS)
            buf[1 + nd++] = (char)p[i];
        else {
            exp10++;
            sticky |= p[i] != '0';
        }
    }
    if (i < n && p[i] == '.') {
        int before = mantissa_digits;
        i++;
        for (; i < n && mqsel_is_digit(p[i]); i++) {
            mantissa_digits++;
            if (nd == 0 && p[i] == '0') {
                exp10--;
                continue;
            }
            if (nd < MQSEL_DIGITS) {
                buf[1 + nd++] = (char)p[i];
                exp10--;
            } else
                sticky |= p[i] != '0';
        }
        if (before == 0 && mantissa_digits == 0)
            return;  /* "." or ".e5": no digit */
    }
    if (mantissa_digits == 0)
        return;
    if (i < n && (p[i] == 'e' || p[i] == 'E')) {
        size_t start;
        i++;
        if (i < n && (p[i] == '+' || p[i] == '-'))
            exp_neg = p[i++] == '-';
        start = i;
        for (; i < n && mqsel_is_digit(p[i]); i++)
            if (e < 1000000000)
                e = e * 10 + (p[i] - '0');
        if (i == start)
            return;
        exp10 += exp_neg ? -e : e;
    }
    if (i != n)
        return;
    if (nd == 0) {
        v->fval = neg ? -0.0 : 0.0;
        v->float_state = 1;
        return;
    }
    if (sticky) {
        buf[1 + nd++] = '1';
        exp10--;
    }
    /* nd <= 801 digits: past these exponents the value is infinite or zero whatever they are */
    if (exp10 > 400)
        return;
    if (exp10 < -2000)
        exp10 = -2000;
    buf[0] = neg ? '-' : '+';
    buf[1 + nd] = 'e';
    snprintf(buf + 2 + nd, 16, "%d", (int)exp10);
    d = strtod(buf, NULL);  /* glibc's strtod rounds correctly; no '.' so no locale matters */
    if (!isfinite(d))
        return;
    v->fval = d;
    v->float_state = 1;
}

static void mqsel_as_bool(mqsel_value *v)
{
    const unsigned char *p = v->p;
    size_t n = v->n, i;
    static const char t[] = "true", f[] = "false";
    const char *want;
    mqsel_strip(&p, &n);
    v->bool_state = -1;
    if (n == 4)
        want = t;
    else if (n == 5)
        want = f;
    else
        return;
    for (i = 0; i < n; i++)
        if ((p[i] | 0x20) != (unsigned char)want[i])
            return;
    v->bool_state = n == 4 ? 2 : 1;
}

/* --- comparisons ------------------------------------------------------------------------ */

static int mqsel_order(int c, uint8_t cmp)
{
    switch (cmp) {
    case MQSEL_EQ: return c == 0;
    case MQSEL_NE: return c != 0;
    case MQSEL_LT: return c < 0;
    case MQSEL_LE: return c <= 0;
    case MQSEL_GT: return c > 0;
    default: return c >= 0;
    }
}

static int mqsel_bytes_order(const unsigned char *a, size_t na, const unsigned char *b, size_t nb)
{
    int c = memcmp(a, b, na < nb ? na : nb);
    if (c)
        return c < 0 ? -1 : 1;
    return (na > nb) - (na < nb);
}

static const unsigned char *mqsel_memmem(const unsigned char *h, size_t n,
                                         const unsigned char *nd, size_t m)
{
    size_t i;
    if (m == 0)
        return h;
    if (m > n)
        return NULL;
    for (i = 0; i + m <= n; i++) {
        const unsigned char *q = memchr(h + i, nd[0], n - m - i + 1);
        if (q == NULL)
            return NULL;
        i = (size_t)(q - h);
        if (memcmp(q, nd, m) == 0)
            return q;
    }
    return NULL;
}

static int mqsel_int_order(mqsel_value *v, int64_t lit)
{
    if (v->int_state == 2)
        return v->sign;
    return (v->ival > lit) - (v->ival < lit);
}

static int mqsel_in(const mqsel_op *op, mqsel_value *v)
{
    int count = op->arg, k, has_int = 0, has_float = 0, unknown = 0;
    for (k = 1; k <= count; k++) {
        if (op[k].op == MQSEL_IN_STR) {
            if (op[k].str_len == v->n && memcmp(op[k].str, v->p, v->n) == 0)
                return MQSEL_TRUE;
        } else if (op[k].op == MQSEL_IN_INT)
            has_int = 1;
        else
            has_float = 1;
    }
    if (has_int) {
        if (v->int_state == 0)
            mqsel_as_int(v);
        if (v->int_state == 1)
            for (k = 1; k <= count; k++)
                if (op[k].op == MQSEL_IN_INT && op[k].ival == v->ival)
                    return MQSEL_TRUE;
        unknown = v->int_state < 0;
    }
    if (has_float) {
        if (v->float_state == 0)
            mqsel_as_float(v);
        if (v->float_state == 1)
            for (k = 1; k <= count; k++)
                if (op[k].op == MQSEL_IN_FLOAT && op[k].fval == v->fval)
                    return MQSEL_TRUE;
        unknown = unknown || v->float_state < 0;
    }
    return unknown ? MQSEL_UNKNOWN : MQSEL_FALSE;
}

static int mqsel_leaf(const mqsel_op *op, mqsel_value *v)
{
    int r;
    if (!v->found)
        return MQSEL_UNKNOWN;
    switch (op->op) {
    case MQSEL_CMP_STR:
        return mqsel_order(mqsel_bytes_order(v->p, v->n, op->str, op->str_len), op->cmp);
    case MQSEL_CMP_INT:
        if (v->int_state == 0)
            mqsel_as_int(v);
        if (v->int_state < 0)
            return MQSEL_UNKNOWN;
        return mqsel_order(mqsel_int_order(v, op->ival), op->cmp);
    case MQSEL_CMP_FLOAT:
        if (v->float_state == 0)
            mqsel_as_float(v);
        if (v->float_state < 0)
            return MQSEL_UNKNOWN;
        return mqsel_order((v->fval > op->fval) - (v->fval < op->fval), op->cmp);
    case MQSEL_CMP_BOOL:
        if (v->bool_state == 0)
            mqsel_as_bool(v);
        if (v->bool_state < 0)
            return MQSEL_UNKNOWN;
        return mqsel_order((v->bool_state - 1) != op->ival, op->cmp);
    case MQSEL_STR_TEST:
        if (op->cmp == MQSEL_CONTAINS)
            r = mqsel_memmem(v->p, v->n, op->str, op->str_len) != NULL;
        else if (op->str_len > v->n)
            r = 0;
        else if (op->cmp == MQSEL_STARTSWITH)
            r = memcmp(v->p, op->str, op->str_len) == 0;
        else
            r = memcmp(v->p + v->n - op->str_len, op->str, op->str_len) == 0;
        return r != op->neg;
    default:  /* MQSEL_IN */
        return mqsel_in(op, v);
    }
}

/* --- header lookup and the program's run ------------------------------------------------- */

/* Read a zigzag varint of at most 5 bytes (header lengths); -2 on a malformed one. */
static inline int64_t mqsel_len(const unsigned char **p, const unsigned char *end)
{
    uint64_t raw = 0;
    int shift = 0;
    if (*p < end && !(**p & 0x80)) {  /* one byte: every length under 64 */
        raw = *(*p)++;
        return (int64_t)(raw >> 1) ^ -(int64_t)(raw & 1);
    }
    while (*p < end && shift <= 28) {
        unsigned char b = *(*p)++;
        raw |= (uint64_t)(b & 0x7F) << shift;
        if (!(b & 0x80))
            return (int64_t)(raw >> 1) ^ -(int64_t)(raw & 1);
        shift += 7;
    }
    return -2;
}

/* Fill vals[0, n_names) from `count` encoded headers in h[0, n). Malformed bytes end the walk
   (the record cursor has already refused such records; this stays safe on any bytes). */
static inline void mqsel_lookup(const mqsel_program *prog, const unsigned char *h, size_t n,
                                int64_t count, mqsel_value *vals)
{
    const unsigned char *p = h, *end = h + n;
    int64_t i, kl, vl;
    int k;
    memset(vals, 0, sizeof(mqsel_value) * (size_t)prog->n_names);
    for (i = 0; i < count; i++) {
        kl = mqsel_len(&p, end);
        if (kl < 0 || kl > end - p)
            break;
        const unsigned char *key = p;
        p += kl;
        vl = mqsel_len(&p, end);
        if (vl < -1 || vl > end - p)
            break;
        const unsigned char *value = p;
        if (vl > 0)
            p += vl;
        if (vl < 0)
            continue;  /* a null value is no property */
        for (k = 0; k < prog->n_names; k++) {
            if (prog->name_len[k] == (size_t)kl && !prog->never[k]
                    && (kl == 0 || prog->names[k][0] == key[0])
                    && memcmp(prog->names[k], key, (size_t)kl) == 0) {
                if (mqsel_utf8_valid(value, (size_t)vl)) {
                    vals[k].found = 1;
                    vals[k].p = value;
                    vals[k].n = (size_t)vl;
                }
                break;
            }
        }
    }
    if (prog->tags_slot >= 0 && !vals[prog->tags_slot].found && vals[prog->tag_slot].found)
        vals[prog->tags_slot] = vals[prog->tag_slot];
}

static int mqsel_and(int a, int b)
{
    if (a == MQSEL_FALSE || b == MQSEL_FALSE)
        return MQSEL_FALSE;
    return a == MQSEL_TRUE && b == MQSEL_TRUE ? MQSEL_TRUE : MQSEL_UNKNOWN;
}

static int mqsel_or(int a, int b)
{
    if (a == MQSEL_TRUE || b == MQSEL_TRUE)
        return MQSEL_TRUE;
    return a == MQSEL_FALSE && b == MQSEL_FALSE ? MQSEL_FALSE : MQSEL_UNKNOWN;
}

/* The selector's Kleene value for one record's headers. `stack` holds prog->stack_depth
   values, `vals` prog->n_names; *seen gains bit k when the record carries name k. */
static int mqsel_run(const mqsel_program *prog, const unsigned char *h, size_t n, int64_t count,
                     mqsel_value *vals, uint8_t *stack, uint64_t *seen)
{
    int pc = 0, top = -1, k;
    mqsel_lookup(prog, h, n, count, vals);
    for (k = 0; k < prog->n_names; k++)
        if (vals[k].found)
            *seen |= (uint64_t)1 << k;
    while (pc < prog->n_ops) {
        const mqsel_op *op = &prog->ops[pc];
        switch (op->op) {
        case MQSEL_CONST:
            stack[++top] = (uint8_t)op->arg;
            break;
        case MQSEL_IS_NULL:
            stack[++top] = vals[op->slot].found ? MQSEL_FALSE : MQSEL_TRUE;
            break;
        case MQSEL_NOT:
            if (stack[top] != MQSEL_UNKNOWN)
                stack[top] = stack[top] == MQSEL_TRUE ? MQSEL_FALSE : MQSEL_TRUE;
            break;
        case MQSEL_AND:
            top--;
            stack[top] = (uint8_t)mqsel_and(stack[top], stack[top + 1]);
            break;
        case MQSEL_OR:
            top--;
            stack[top] = (uint8_t)mqsel_or(stack[top], stack[top + 1]);
            break;
        case MQSEL_JUMP_FALSE:
            if (stack[top] == MQSEL_FALSE) {
                pc = op->arg;
                continue;
            }
            break;
        case MQSEL_JUMP_TRUE:
            if (stack[top] == MQSEL_TRUE) {
                pc = op->arg;
                continue;
            }
            break;
        case MQSEL_IN:
            stack[++top] = (uint8_t)mqsel_leaf(op, &vals[op->slot]);
            pc += op->arg + 1;
            continue;
        default:
            stack[++top] = (uint8_t)mqsel_leaf(op, &vals[op->slot]);
        }
        pc++;
    }
    return top == 0 ? stack[0] : MQSEL_UNKNOWN;
}

#endif
