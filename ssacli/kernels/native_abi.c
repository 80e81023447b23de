/* The layout of every kernel's argument struct (native_abi.h), for ssacli.kernels.native_abi to
 * compare with its ctypes structs before any kernel is called: per struct its size, per field its
 * name, offset, size and kind. All of it comes from the same field lists as the structs themselves,
 * so the table cannot drift from them.
 */
#include <stddef.h>
#include <string.h>

#include "native_abi.h"

struct ssacli_field {
    const char *name;
    int64_t offset, size;
    char kind; /* 'p' pointer, 'f' floating point, 'i' integer: what ctypes must declare */
};

/* GCC's and Clang's type classes (the sources already need one of them for vector extensions):
 * 5 pointer, 8 real; everything else our fields use (int, int64_t) is an integer. */
#define SSACLI_KIND(e) (__builtin_classify_type(e) == 5 ? 'p' : __builtin_classify_type(e) == 8 ? 'f' : 'i')
#define SSACLI_ENTRY(S, type, name)                                                                   \
    {#name, (int64_t)offsetof(struct S, name), (int64_t)sizeof(((struct S *)0)->name),              \
     SSACLI_KIND(((struct S *)0)->name)},
#define SSACLI_TABLE(kernel, FIELDS) static const struct ssacli_field kernel##_fields[] = {FIELDS(SSACLI_ENTRY, kernel##_args)};
SSACLI_KERNELS(SSACLI_TABLE)

struct ssacli_layout {
    const char *kernel;
    int64_t size, count;
    const struct ssacli_field *fields;
};
#define SSACLI_LAYOUT(kernel, FIELDS)                                                                 \
    {#kernel, (int64_t)sizeof(struct kernel##_args),                                                  \
     (int64_t)(sizeof kernel##_fields / sizeof kernel##_fields[0]), kernel##_fields},
static const struct ssacli_layout layouts[] = {SSACLI_KERNELS(SSACLI_LAYOUT)};
#define N_LAYOUTS ((int64_t)(sizeof layouts / sizeof layouts[0]))

/* The name of kernel i (0, 1, ...), NULL past the last: Python checks it knows every one. */
const char *ssacli_abi_kernel(int64_t i) { return i >= 0 && i < N_LAYOUTS ? layouts[i].kernel : NULL; }

/* sizeof kernel's argument struct, its field count written to *count; -1 for an unknown kernel. */
int64_t ssacli_abi_size(const char *kernel, int64_t *count) {
    for (int64_t i = 0; i < N_LAYOUTS; i++)
        if (strcmp(layouts[i].kernel, kernel) == 0) {
            *count = layouts[i].count;
            return layouts[i].size;
        }
    return -1;
}

/* Field i of kernel's argument struct: its name, offset, size and kind; returns 0, or -1 where the
 * kernel or the field does not exist (nothing written). */
int ssacli_abi_field(const char *kernel, int64_t i, const char **name, int64_t *offset, int64_t *size,
                     char *kind) {
    for (int64_t j = 0; j < N_LAYOUTS; j++)
        if (strcmp(layouts[j].kernel, kernel) == 0) {
            if (i < 0 || i >= layouts[j].count) return -1;
            const struct ssacli_field *f = &layouts[j].fields[i];
            *name = f->name, *offset = f->offset, *size = f->size, *kind = f->kind;
            return 0;
        }
    return -1;
}
