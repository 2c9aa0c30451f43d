#include "server/auth.h"

#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>

namespace ithaca {
namespace {

std::string WriteSecret(const std::string& name, const std::string& content, mode_t mode) {
  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
  unlink(path.c_str());
  std::ofstream(path) << content;
  chmod(path.c_str(), mode);
  return path;
}

TEST(AuthTest, TokenFileMustBePrivateAndLongEnough) {
  const std::string token = "0123456789abcdef0123456789abcdef";
  auto ok = ReadTokenFile(WriteSecret("token", "  " + token + "\n", 0600), "--auth-token-file");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(*ok, token);

  auto world = ReadTokenFile(WriteSecret("world", token, 0644), "--auth-token-file");
  EXPECT_EQ(world.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(world.status().message().find("--auth-token-file"), std::string::npos);
  EXPECT_NE(world.status().message().find("chmod 600"), std::string::npos);
  EXPECT_EQ(world.status().message().find(token), std::string::npos);

  auto short_token = ReadTokenFile(WriteSecret("short", "tooshort\n", 0600), "--auth-token-file");
  EXPECT_FALSE(short_token.ok());
  EXPECT_NE(short_token.status().message().find("at least 16"), std::string::npos);
  EXPECT_EQ(short_token.status().message().find("tooshort"), std::string::npos);

  auto spaces = ReadTokenFile(WriteSecret("spaces", "a secret with spaces\n", 0600), "--t");
  EXPECT_FALSE(spaces.ok());
  EXPECT_EQ(spaces.status().message().find("secret"), std::string::npos);

  EXPECT_FALSE(ReadTokenFile("/nonexistent/token", "--t").ok());
  EXPECT_FALSE(ReadTokenFile(std::getenv("TEST_TMPDIR"), "--t").ok());  // a directory
}

TEST(AuthTest, ConstantTimeEquals) {
  EXPECT_TRUE(ConstantTimeEquals("abcdefgh", "abcdefgh"));
  EXPECT_FALSE(ConstantTimeEquals("abcdefgX", "abcdefgh"));
  EXPECT_FALSE(ConstantTimeEquals("abcdefg", "abcdefgh"));
  EXPECT_FALSE(ConstantTimeEquals("abcdefghi", "abcdefgh"));
  EXPECT_FALSE(ConstantTimeEquals("", "abcdefgh"));
  EXPECT_TRUE(ConstantTimeEquals("", ""));
}

TEST(AuthTest, LoopbackAddresses) {
  for (const char* a : {"127.0.0.1:50051", "127.3.4.5:1", "localhost:50051", "[::1]:50051",
                        "unix:/tmp/x.sock", "unix-abstract:ithaca"}) {
    EXPECT_TRUE(IsLoopbackListen(a)) << a;
  }
  for (const char* a : {"0.0.0.0:50051", "[::]:50051", ":50051", "10.0.0.1:50051",
                        "[fe80::1]:50051", "ithacad.example.com:50051", "[::ffff:10.0.0.1]:1"}) {
    EXPECT_FALSE(IsLoopbackListen(a)) << a;
  }
}

TEST(AuthTest, NonLoopbackNeedsTokenOrTlsOrInsecure) {
  auto open = LoadServerSecurity({"0.0.0.0:50051", "", "", "", false});
  EXPECT_EQ(open.status().code(), absl::StatusCode::kFailedPrecondition);
  for (const char* what : {"--auth-token-file", "--tls-cert", "--insecure"}) {
    EXPECT_NE(open.status().message().find(what), std::string::npos) << open.status();
  }
  EXPECT_TRUE(LoadServerSecurity({"0.0.0.0:50051", "", "", "", true}).ok());
  EXPECT_TRUE(LoadServerSecurity({"127.0.0.1:0", "", "", "", false}).ok());
  const std::string token = WriteSecret("t2", "0123456789abcdef0123", 0600);
  auto with_token = LoadServerSecurity({"0.0.0.0:50051", token, "", "", false});
  ASSERT_TRUE(with_token.ok()) << with_token.status();
  EXPECT_TRUE(with_token->authenticator->enabled());
  EXPECT_FALSE(with_token->tls);
  EXPECT_NE(with_token->warning.find("clear text"), std::string::npos);
  EXPECT_TRUE(LoadServerSecurity({"127.0.0.1:1", token, "", "", false})->warning.empty());
  // Half a TLS configuration is an error, not plaintext.
  auto half = LoadServerSecurity({"127.0.0.1:0", "", "/some/cert.pem", "", false});
  EXPECT_EQ(half.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(half.status().message().find("--tls-key"), std::string::npos);
  // A private key readable by others is refused.
  const std::string cert = WriteSecret("cert.pem", "-----BEGIN CERTIFICATE-----\n", 0644);
  const std::string key = WriteSecret("key.pem", "-----BEGIN PRIVATE KEY-----\n", 0644);
  auto open_key = LoadServerSecurity({"127.0.0.1:0", "", cert, key, false});
  EXPECT_NE(open_key.status().message().find("--tls-key"), std::string::npos) << open_key.status();
}

TEST(AuthTest, AuthorizeWithoutMetadata) {
  // Real calls with right and wrong tokens: services_test and tests/e2e/security_e2e_test.
  // Here: a disabled authenticator lets everything through, an enabled one nothing unsigned.
  Authenticator none("");
  grpc::ServerContext context;
  EXPECT_TRUE(none.Authorize(context).ok());
  Authenticator on("0123456789abcdef");
  grpc::Status st = on.Authorize(context);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED);
}

}  // namespace
}  // namespace ithaca
