# TEST DOUBLE: shared helpers of the kubeadm/etcdadm stand-ins (see README.md). NOT kubeadm,
# NOT etcdadm. POSIX sh (busybox ash) + the openssl CLI only; independent of certrotor's code.
# Sourced by /opt/bin/kubeadm and /opt/bin/etcdadm. Never prints key material.

die() {
    echo "$STANDIN_TOOL (certrotor test stand-in): error: $*" >&2
    exit 1
}

# Test hooks, looked up in the folder the tool works on (the staged copy certrotor mounted):
#   .standin-fail      exit 3 before writing anything
#   .standin-sleep     after renewing, sleep that many seconds (a run to kill mid-engine)
#   .standin-mounts    print the mountinfo lines of the tool's folders
standin_hooks_before() {
    flags=$1
    if [ -e "$flags/.standin-fail" ]; then
        echo "$STANDIN_TOOL (stand-in): failing as asked by $flags/.standin-fail" >&2
        exit 3
    fi
    if [ -e "$flags/.standin-mounts" ]; then
        for m in $2; do
            awk -v m="$m" '$5 == m { print "standin-mount: " $5 " root=" $4 " opts=" $6 }' /proc/self/mountinfo
        done
    fi
}

standin_hooks_after() {
    if [ -e "$1/.standin-sleep" ]; then
        secs=$(cat "$1/.standin-sleep")
        echo "$STANDIN_TOOL (stand-in): sleeping ${secs}s as asked by $1/.standin-sleep" >&2
        sleep "${secs:-300}"
    fi
}

# openssl's text form of a certificate.
cert_text() { openssl x509 -in "$1" -noout -text; }

# "RSA 2048", "EC prime256v1" or "EC secp384r1" for a certificate.
key_algorithm() {
    text=$(cert_text "$1")
    case $text in
    *"Public Key Algorithm: rsaEncryption"*)
        bits=$(echo "$text" | sed -n 's/.*Public-Key: (\([0-9]*\) bit).*/\1/p' | head -n 1)
        echo "RSA $bits"
        ;;
    *"Public Key Algorithm: id-ecPublicKey"*)
        curve=$(echo "$text" | sed -n 's/.*ASN1 OID: \([a-z0-9]*\).*/\1/p' | head -n 1)
        echo "EC $curve"
        ;;
    *) die "unsupported key algorithm in $1" ;;
    esac
}

# new_key ALG OUT: a new key in Go's encodings (PKCS#1 "RSA PRIVATE KEY", SEC1 "EC PRIVATE KEY").
new_key() {
    umask 077
    case $1 in
    "RSA "*) openssl genrsa -traditional -out "$2" "${1#RSA }" 2> /dev/null || die "genrsa failed" ;;
    "EC "*) openssl ecparam -name "${1#EC }" -genkey -noout -out "$2" || die "ecparam failed" ;;
    esac
}

# The value lines of an extension in openssl's text output ("X509v3 Key Usage").
ext_value() {
    echo "$1" | awk -v name="$2" '
        found { sub(/^ +/, ""); print; exit }
        index($0, name ":") { found = 1 }'
}

# openssl's printed names -> config names.
ku_conf() {
    echo "$1" | sed -e 's/Digital Signature/digitalSignature/' -e 's/Key Encipherment/keyEncipherment/' \
        -e 's/Non Repudiation/nonRepudiation/' -e 's/Data Encipherment/dataEncipherment/' \
        -e 's/Key Agreement/keyAgreement/' -e 's/Certificate Sign/keyCertSign/' -e 's/CRL Sign/cRLSign/'
}
eku_conf() {
    echo "$1" | sed -e 's/TLS Web Server Authentication/serverAuth/' \
        -e 's/TLS Web Client Authentication/clientAuth/'
}
san_conf() { echo "$1" | sed -e 's/IP Address:/IP:/g'; }

# openssl -startdate/-enddate form of a Unix time.
gtime() { date -u -d "@$1" +%Y%m%d%H%M%SZ; }

# sign_csr CSR CA_CRT CA_KEY EXTFILE NOT_BEFORE NOT_AFTER OUT: issues with `openssl ca`, which
# (unlike `openssl x509 -req` in OpenSSL 3.0) can set notBefore; the request's subject is kept
# byte for byte (-preserveDN).
sign_csr() {
    sw=$(mktemp -d)
    : > "$sw/index.txt"
    md=sha256
    case $(key_algorithm "$2") in "EC secp384r1") md=sha384 ;; esac
    cat > "$sw/ca.cnf" << EOF
[ca]
default_ca = standin
[standin]
database = $sw/index.txt
new_certs_dir = $sw
rand_serial = yes
unique_subject = no
email_in_dn = no
policy = any
[any]
EOF
    openssl ca -batch -notext -config "$sw/ca.cnf" -preserveDN -md "$md" \
        -in "$1" -cert "$2" -keyfile "$3" -extfile "$4" -extensions v3 \
        -startdate "$(gtime "$5")" -enddate "$(gtime "$6")" -out "$7" > "$sw/log" 2>&1 ||
        { cat "$sw/log" >&2; rm -rf "$sw"; die "openssl ca failed for $7"; }
    rm -rf "$sw"
}
