// Prints the private key of one entry of a PKCS12 keystore as unencrypted
// PKCS#8 PEM: keytool makes keys and certificates but exports certificates
// only, and a client of the development broker's mTLS listener needs its key
// as PEM. Run by dev/kafka_secured.ts as a source-file program (JDK 11+):
//   java ExportKey.java <keystore.p12> <alias> <password>
import java.io.FileInputStream;
import java.security.Key;
import java.security.KeyStore;
import java.util.Base64;

public class ExportKey {
  public static void main(String[] args) throws Exception {
    char[] password = args[2].toCharArray();
    KeyStore store = KeyStore.getInstance("PKCS12");
    try (FileInputStream in = new FileInputStream(args[0])) {
      store.load(in, password);
    }
    Key key = store.getKey(args[1], password);
    String body = Base64.getMimeEncoder(64, "\n".getBytes()).encodeToString(key.getEncoded());
    System.out.print("-----BEGIN PRIVATE KEY-----\n" + body + "\n-----END PRIVATE KEY-----\n");
  }
}
